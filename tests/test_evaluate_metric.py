"""The translation metric as an evaluate module (attention_seq2seq/evaluate_modules/translation_scores).

It is the one implementation of the package's scores: these tests load it with ``evaluate.load``
from the path the package exposes, with the Hub offline, and compare its numbers and signatures,
bit for bit, with the sacreBLEU calls the package made before it existed, on the Multi30k test set
(../shared/data, skipped without it), the committed Bible test pairs and the Tatoeba zh test pairs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

from helpers import FAMILIES, FIXTURE_PAIRS, REPO_ROOT, shared_data_dir, tatoeba_dir, tiny_run_config, tiny_tokenizer

import attention_seq2seq
from attention_seq2seq.translation.scores import corpus_scores

MODULE_FILE = Path(attention_seq2seq.TRANSLATION_METRIC_PATH) / "translation_scores.py"


@pytest.fixture(scope="module")
def metric(quiet_datasets):
    return attention_seq2seq.load_translation_metric(keep_in_memory=True)


def _read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _system_output(references: list[str]) -> list[str]:
    """A deterministic imperfect "system": every 4th word dropped, every 3rd sentence lower-cased,
    every 5th replaced by the next reference (so no score is 0 or 100)."""
    out = []
    for index, reference in enumerate(references):
        words = reference.split()
        text = " ".join(word for position, word in enumerate(words) if position % 4 != 3)
        if index % 3 == 0:
            text = text.lower()
        if index % 5 == 0:
            text = references[(index + 1) % len(references)]
        out.append(text)
    return out


def _direct_sacrebleu(hyps: list[str], refs: list[str], tokenize: str, n_bootstrap: int = 1) -> dict:
    """The sacreBLEU calls of training/metrics.py (now translation/scores.py) \
before the module (commit 796bb1c), written out, and TER (sacreBLEU's defaults) since it joined."""
    metrics = {
        "bleu": sacrebleu.BLEU(tokenize=tokenize),
        "bleu_lowercase": sacrebleu.BLEU(tokenize=tokenize, lowercase=True),
        "chrf": sacrebleu.CHRF(),
        "ter": sacrebleu.TER(),
    }
    result, signatures = {}, {}
    for name, scorer in metrics.items():
        score = scorer.corpus_score(hyps, [refs], n_bootstrap=n_bootstrap)
        signature = signatures[f"{name}_signature"] = str(scorer.get_signature())
        result[name] = float(score.score)
        if n_bootstrap > 1:
            as_json = json.loads(score.format(width=6, signature=signature, is_json=True))
            result[f"{name}_ci95"] = float(as_json["confidence_var"])
    return {**result, **signatures}


def _test_sets():
    multi30k = shared_data_dir() / "multi30k" / "test2016.en"
    tatoeba = tatoeba_dir() / "test.tsv"
    return [
        pytest.param(
            multi30k,
            "en",
            "13a",
            id="multi30k-test2016",
            marks=pytest.mark.skipif(not multi30k.exists(), reason=f"{multi30k} not found"),
        ),
        pytest.param(FIXTURE_PAIRS / "test.en", "en", "13a", id="bible-test"),
        pytest.param(tatoeba, "zh", "zh", id="tatoeba-zh-test"),
    ]


def _references(path: Path) -> list[str]:
    if path.suffix == ".tsv":  # Tatoeba: "zh<TAB>en" per line; the Chinese side is the target here
        return [line.split("\t")[0] for line in _read_lines(path)]
    return _read_lines(path)


@pytest.mark.parametrize(("path", "target_lang", "tokenizer"), _test_sets())
def test_module_scores_equal_sacrebleu_called_directly(metric, path, target_lang, tokenizer, no_network):
    refs = _references(path)
    hyps = _system_output(refs)
    expected = _direct_sacrebleu(hyps, refs, tokenizer)
    from_module = metric.compute(predictions=hyps, references=refs, target_lang=target_lang)
    from_package = corpus_scores(hyps, refs, target_lang=target_lang)
    assert from_module == expected  # floats and signatures, bit for bit
    assert from_package == expected
    assert f"tok:{tokenizer}" in expected["bleu_signature"] and 0.0 < expected["bleu"] < 100.0


def test_bootstrap_intervals_equal_sacrebleu_called_directly(metric):
    refs = _read_lines(FIXTURE_PAIRS / "test.en")
    hyps = _system_output(refs)
    expected = _direct_sacrebleu(hyps, refs, "13a", n_bootstrap=100)
    assert metric.compute(predictions=hyps, references=refs, n_bootstrap=100) == expected
    assert corpus_scores(hyps, refs, n_bootstrap=100) == expected
    assert "bs:100|seed:12345" in expected["chrf_signature"] and expected["bleu_ci95"] > 0


def test_config_name_is_the_default_target_language_and_tokenize_overrides_it(quiet_datasets):
    hyps, refs = ["我们 走 吧", "好吧"], ["我们走吧", "好吧，你赢了。"]
    chinese = attention_seq2seq.load_translation_metric("zh", keep_in_memory=True)
    assert chinese.config_name == "zh"
    assert chinese.compute(predictions=hyps, references=refs) == corpus_scores(hyps, refs, target_lang="zh")
    as_13a = chinese.compute(predictions=hyps, references=refs, tokenize="13a")
    assert as_13a == corpus_scores(hyps, refs, target_lang="en")
    assert "tok:13a" in as_13a["bleu_signature"]


def test_bad_options_name_the_valid_values(metric):
    with pytest.raises(ValueError, match="tokenize must be one of .*13a.*got 'spacy'"):
        metric.compute(predictions=["a b"], references=["a b"], tokenize="spacy")
    with pytest.raises(ValueError, match="n_bootstrap must be 1 .*got 0"):
        metric.compute(predictions=["a b"], references=["a b"], n_bootstrap=0)


def test_the_folder_imports_one_library_per_line_and_nothing_of_the_package():
    """evaluate copies the script and its relative imports and checks each `import` line's library
    (a metric Space gets the same files): nothing may reach the package, and the computation the
    package itself imports (compute_scores.py) must not import evaluate."""
    from evaluate.loading import get_imports

    imports = {(kind, name) for kind, name, _, _ in get_imports(str(MODULE_FILE))}
    assert imports == {("library", "datasets"), ("library", "evaluate"), ("internal", "compute_scores")}
    computation = {(kind, name) for kind, name, _, _ in get_imports(str(MODULE_FILE.parent / "compute_scores.py"))}
    assert computation == {("library", "json"), ("library", "sacrebleu")}
    for path in (MODULE_FILE, MODULE_FILE.parent / "compute_scores.py"):
        code_lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
        assert not [
            line for line in code_lines if line.startswith(("import ", "from ")) and "attention_seq2seq" in line
        ]
    card = (MODULE_FILE.parent / "README.md").read_text(encoding="utf-8")
    assert card.startswith("---\n") and "tags:\n- evaluate\n- metric" in card


def test_evaluate_runs_the_package_computation_from_its_module_cache(metric):
    """evaluate.load imported the copies of both files from its modules cache (not the package)."""
    script = sys.modules[type(metric).__module__]
    computation = sys.modules[script.__name__.rsplit(".", 1)[0] + ".compute_scores"]
    assert Path(computation.__file__).read_bytes() == (MODULE_FILE.parent / "compute_scores.py").read_bytes()
    assert not script.__name__.startswith("attention_seq2seq")


_LIGHT_IMPORTS = r"""
import json, sys
import attention_seq2seq
import attention_seq2seq.translation.scores
path = attention_seq2seq.TRANSLATION_METRIC_PATH
print(json.dumps([path, sorted(name for name in ("evaluate", "datasets", "torch") if name in sys.modules)]))
"""


def test_the_path_is_exposed_without_importing_evaluate():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", _LIGHT_IMPORTS], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    path, heavy = json.loads(out.stdout.strip().splitlines()[-1])
    assert heavy == []
    assert Path(path, "translation_scores.py").is_file() and Path(path, "README.md").is_file()


_WITHOUT_NETWORK = r"""
import json, socket, sys
def refuse(*args, **kwargs):
    raise AssertionError(f"network use: {args}")
socket.socket.connect = refuse
socket.create_connection = refuse
import attention_seq2seq
metric = attention_seq2seq.load_translation_metric()  # with evaluate's default cache file, too
print(json.dumps(metric.compute(predictions=["a man rides a horse ."], references=["a man rides a brown horse ."])))
"""


@pytest.mark.slow
def test_loading_needs_no_network_even_without_the_offline_variables(tmp_path):
    """A fresh modules cache, HF_HUB_OFFLINE unset, every socket refused: evaluate.load of the
    package's folder and compute still work (nothing is looked up on the Hub)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    env.update(HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HOME=str(tmp_path / "hf-home"))
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_NETWORK], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == corpus_scores(["a man rides a horse ."], ["a man rides a brown horse ."])


_FROM_WHEEL = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import attention_seq2seq
metric = attention_seq2seq.load_translation_metric(keep_in_memory=True)
result = metric.compute(predictions=["the cat sat on the mat"], references=["the cat sat on a mat"])
print(json.dumps([attention_seq2seq.TRANSLATION_METRIC_PATH, result]))
"""


@pytest.mark.slow
def test_a_non_editable_install_ships_the_module(tmp_path):
    """The wheel holds the metric folder (script and card) and `evaluate.load` finds it there."""
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(wheels),
            str(REPO_ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("attention_seq2seq-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    folder = "attention_seq2seq/evaluate_modules/translation_scores/"
    assert {
        folder + "translation_scores.py",
        folder + "compute_scores.py",
        folder + "README.md",
        folder + "requirements.txt",
    } <= names
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)  # what pip puts in site-packages
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    out = subprocess.run(
        [sys.executable, "-c", _FROM_WHEEL, str(target)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    path, result = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(path).is_relative_to(target)
    assert result == corpus_scores(["the cat sat on the mat"], ["the cat sat on a mat"])


# ------------------------------------------------------------------------------------------------
# evaluate's evaluator("translation") under transformers v5, and the two-line alternative


def test_the_translation_evaluator_is_refused_by_transformers_v5():
    """What docs/evaluate-metric.md says: transformers v5 removed the "translation" task, so
    evaluate 0.4.6's evaluator("translation") fails before it sees a model. Should a later
    evaluate or transformers accept it, this test fails and the docs must change."""
    import evaluate

    with pytest.raises(KeyError, match="The task translation has been removed from transformers"):
        evaluate.evaluator("translation")


@pytest.mark.parametrize("family", FAMILIES)
def test_pipeline_then_metric_is_the_evaluator_in_two_lines(family, metric, tmp_path, no_network):
    """predictions from our translation pipeline over a datasets split, then metric.compute: the
    same scores as decoding each sentence alone with generate()."""
    import datasets
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from attention_seq2seq.modeling.pipeline_translation import Seq2SeqTranslationPipeline

    tokenizer = tiny_tokenizer(tmp_path)
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(tiny_run_config(family, len(tokenizer))).eval()
    model.generation_config.max_new_tokens = 8
    sources = _read_lines(FIXTURE_PAIRS / "test.es")[:6]
    data = datasets.Dataset.from_dict({"text": sources, "label": _read_lines(FIXTURE_PAIRS / "test.en")[:6]})
    pipe = Seq2SeqTranslationPipeline(model=model, tokenizer=tokenizer, task="translation")

    # The two lines of the docs:
    predictions = [out["translation_text"] for out in pipe(list(data["text"]), batch_size=4)]
    scores = metric.compute(predictions=predictions, references=data["label"], target_lang="en")

    one_by_one = []
    for source in sources:
        with torch.no_grad():
            ids = model.generate(**tokenizer([source], return_tensors="pt"))
        one_by_one.append(tokenizer.decode(ids[0], skip_special_tokens=True))
    assert predictions == one_by_one
    assert scores == corpus_scores(one_by_one, list(data["label"]), target_lang="en")
    assert set(scores) == {
        "bleu",
        "bleu_lowercase",
        "chrf",
        "ter",
        "bleu_signature",
        "bleu_lowercase_signature",
        "chrf_signature",
        "ter_signature",
    }


# ------------------------------------------------------------------------------------------------
# Seq2SeqTrainer's compute_metrics (training/finetune_trainer.py)


def test_seq2seq_trainer_compute_metrics_runs_the_evaluate_module(monkeypatch, tmp_path):
    """build_compute_metrics loads the package's metric through evaluate (in memory) and its
    numbers are the module's on the decoded text."""
    from transformers import EvalPrediction

    from attention_seq2seq.training import finetune_trainer as ft

    loaded = []
    import attention_seq2seq.translation.scores as package_metrics

    real_load = package_metrics.load_translation_metric

    def spy(*args, **kwargs):
        loaded.append(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(package_metrics, "load_translation_metric", spy)
    tokenizer = tiny_tokenizer(tmp_path)
    refs = _read_lines(FIXTURE_PAIRS / "test.en")[:5]
    hyps = _system_output(refs)
    encoded_hyps = [tokenizer(text_target=h)["input_ids"] for h in hyps]
    encoded_refs = [tokenizer(text_target=r)["input_ids"] for r in refs]
    width = max(len(ids) for ids in encoded_hyps + encoded_refs)
    predictions = np.full((len(hyps), width), -100, dtype=np.int64)
    labels = np.full((len(refs), width), -100, dtype=np.int64)
    for row, (h, r) in enumerate(zip(encoded_hyps, encoded_refs)):
        predictions[row, : len(h)], labels[row, : len(r)] = h, r

    scores = ft.build_compute_metrics(tokenizer)(EvalPrediction(predictions=predictions, label_ids=labels))
    assert loaded == [{"keep_in_memory": True}]
    decoded_hyps = ft.decode_ids(tokenizer, predictions, tokenizer.pad_token_id)
    decoded_refs = ft.decode_ids(tokenizer, labels, tokenizer.pad_token_id)
    expected = corpus_scores(decoded_hyps, decoded_refs)
    assert (scores["bleu"], scores["chrf"]) == (expected["bleu"], expected["chrf"])
    assert 0.0 < scores["bleu"] < 100.0


def test_sentence_scores_are_sacrebleu_s_per_sentence_scores(metric):
    # what `sacrebleu -sl` computes: sentence BLEU with effective order, chrF and TER per line
    from attention_seq2seq.translation.scores import sentence_scores

    refs = _read_lines(FIXTURE_PAIRS / "test.en")[:20]
    hyps = _system_output(refs)
    rows, signatures = sentence_scores(hyps, refs, target_lang="en")
    assert len(rows) == len(refs)
    bleu, chrf, ter = sacrebleu.BLEU(effective_order=True), sacrebleu.CHRF(), sacrebleu.TER()
    for row, hyp, ref in zip(rows, hyps, refs):
        assert row == {
            "bleu": bleu.sentence_score(hyp, [ref]).score,
            "chrf": chrf.sentence_score(hyp, [ref]).score,
            "ter": ter.sentence_score(hyp, [ref]).score,
        }
    (same,), _ = sentence_scores(["a b c d"], ["a b c d"])
    assert same["bleu"] == pytest.approx(100.0) and same["chrf"] == 100.0 and same["ter"] == 0.0
    (off,), _ = sentence_scores(["a b x d"], ["a b c d"])
    assert off["ter"] == 25.0  # one substitution per 4 reference words
    assert signatures["ter_signature"].startswith("nrefs:1|case:lc|tok:tercom")
