"""``export --format onnx`` and its runtime (hub/export_onnx.py, hub/onnx_graphs.py,
translation/onnx_runtime.py, translation/onnx_backend.py).

For every RNN variant of the RNN tests' grid and every Transformer layout: the exported graphs,
decoded by the numpy runtime, give the very tokens of the PyTorch model's ``generate`` (greedy,
and beam search with two returned sequences), with the same beam scores; and through the
commands: ``translate``/``evaluate`` of an export give the PyTorch model's lines, the shipped
``onnx_runtime.py`` runs with PyTorch made unimportable, and every refusal is one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import (
    RNN_VARIANTS,
    TRANSFORMER_LAYOUTS,
    layout_transformer,
    one_line_error,
    read_pairs,
    rnn_model,
    tiny_tokenizer,
)

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from attention_seq2seq.common.errors import UserError  # noqa: E402
from attention_seq2seq.cli import main  # noqa: E402
from attention_seq2seq.hub.export import ExportError  # noqa: E402
from attention_seq2seq.hub.export_onnx import OnnxExportRefused, export_onnx  # noqa: E402
from attention_seq2seq.translation.onnx_runtime import OnnxSeq2Seq, top_k  # noqa: E402

MODELS = [f"rnn:{name}" for name in RNN_VARIANTS] + [f"transformer:{name}" for name in TRANSFORMER_LAYOUTS]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.getbasetemp())


def build(name: str, vocab_size: int):
    """The model ``name`` of :data:`MODELS`. The RNNs start uniform in [-0.5, 0.5], not the RNN
    tests' [-1, 1]: with [-1, 1] the tiny decoder is expansive (a difference in its state grows
    about 1.9x per step with local-p's input feeding on a 57-token source, since p_t = S sigmoid(.)
    moves S times faster than its argument), so float32 rounding of two correct implementations
    grows from 1e-7 to 1e-4 in ten steps and then moves a window edge |s - p_t| = D; no tolerance
    bounds that. With [-0.5, 0.5] every variant is contractive: a step's rounding difference
    (about 1e-6 in log-probabilities) does not grow, so a decode's score, the mean of its steps,
    differs by about 1e-6, and the 1e-4 of the score checks below is 100 times that."""
    family, _, variant = name.partition(":")
    if family == "rnn":
        return rnn_model(variant, vocab_size=vocab_size, hidden_size=16, embedding_size=12, init_range=0.5)
    return layout_transformer(vocab_size, variant, max_position_embeddings=160)


def saved(model, tokenizer, folder: Path) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def sources(n: int = 10) -> list[str]:
    return [source for source, _ in read_pairs(n, split="val")]


def _cut(row: list[int], eos: int, pad: int) -> list[int]:
    if eos in row:
        return row[: row.index(eos) + 1]
    row = list(row)
    while row and row[-1] == pad:  # stopped by the length limit: a shorter row of the batch is padded
        row.pop()
    return row


def generated(sequences: torch.Tensor, eos: int, pad: int) -> list[list[int]]:
    """generate()'s rows without the start token, cut after the first </s> (trailing pads dropped
    from a row the length limit ended: a tiny model may emit the pad id itself)."""
    return [_cut(row, eos, pad) for row in sequences[:, 1:].tolist()]


def hypotheses_tokens(found, eos: int, pad: int) -> list[list[int]]:
    return [_cut(h.tokens, eos, pad) for hyps in found for h in hyps]


# ---------------------------------------------------------------------------------------------
# The runtime's search against generate()


@pytest.mark.parametrize("name", MODELS)
def test_onnx_greedy_and_beam_search_give_generates_tokens(name, tokenizer, tmp_path):
    model = build(name, len(tokenizer))
    folder = export_onnx(saved(model, tokenizer, tmp_path / "model"), tmp_path / "onnx", sentences=sources(4))
    runner = OnnxSeq2Seq(folder)
    texts = sources(10)
    rows = [tokenizer(text)["input_ids"] for text in texts]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    with torch.no_grad():
        greedy = model.generate(**batch, num_beams=1, max_new_tokens=24, do_sample=False)
        beam = model.generate(
            **batch,
            num_beams=3,
            num_return_sequences=2,
            max_new_tokens=24,
            output_scores=True,
            return_dict_in_generate=True,
        )
    ours_greedy = runner.generate(rows, num_beams=1, max_new_tokens=24)
    assert hypotheses_tokens(ours_greedy, eos, pad) == generated(greedy, eos, pad)
    found = runner.generate(rows, num_beams=3, num_return_sequences=2, max_new_tokens=24)
    assert hypotheses_tokens(found, eos, pad) == generated(beam.sequences, eos, pad)
    scores = torch.tensor([h.score for hyps in found for h in hyps])
    torch.testing.assert_close(scores, beam.sequences_scores.float(), atol=1e-4, rtol=0)
    # the total log-probability is the normalised score times length^alpha (alpha = 1 here)
    for h in (h for hyps in found for h in hyps):
        assert h.logprob == pytest.approx(h.score * len(h.tokens), rel=1e-5)


def test_onnx_greedy_logprob_is_the_sum_of_the_steps_log_softmax(tokenizer, tmp_path):
    """The greedy total against a hand computation from generate()'s own per-step logits."""
    model = build("rnn:luong-general-feed-gru", len(tokenizer))
    folder = export_onnx(saved(model, tokenizer, tmp_path / "m"), tmp_path / "onnx")
    text = sources(1)[0]
    batch = tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**batch, num_beams=1, max_new_tokens=12, output_scores=True, return_dict_in_generate=True)
    tokens = out.sequences[0, 1:]
    expected = sum(torch.log_softmax(step[0].float(), -1)[token].item() for step, token in zip(out.scores, tokens))
    (hypothesis,) = OnnxSeq2Seq(folder).generate([batch["input_ids"][0].tolist()], num_beams=1, max_new_tokens=12)[0:1]
    assert hypothesis[0].logprob == pytest.approx(expected, abs=1e-4)


def test_top_k_against_torch():
    values = torch.randn(3, 50)
    assert top_k(values.numpy(), 7).tolist() == torch.topk(values, 7).indices.tolist()


def test_length_limit_and_early_stopping_variants_match_generate(tokenizer, tmp_path):
    model = build("transformer:pre-sinusoidal", len(tokenizer))
    folder = export_onnx(saved(model, tokenizer, tmp_path / "m"), tmp_path / "onnx")
    runner = OnnxSeq2Seq(folder)
    texts = sources(6)
    rows = [tokenizer(text)["input_ids"] for text in texts]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    for options in (
        dict(num_beams=4, max_new_tokens=5),  # the limit ends every hypothesis
        dict(num_beams=4, max_new_tokens=16, early_stopping=True),
        dict(num_beams=4, max_new_tokens=16, early_stopping="never", length_penalty=0.6),
    ):
        with torch.no_grad():
            reference = model.generate(**batch, **options)
        eos, pad = model.config.eos_token_id, model.config.pad_token_id
        ours = hypotheses_tokens(runner.generate(rows, **options), eos, pad)
        assert ours == generated(reference, eos, pad), options
    with pytest.raises(ValueError, match="max_position_embeddings=160"):
        runner.generate(rows, max_new_tokens=400)


# ---------------------------------------------------------------------------------------------
# The export


def test_export_refuses_a_decoding_default_the_runtime_lacks(tokenizer, tmp_path):
    model = build("transformer:post-sinusoidal", len(tokenizer))
    model.generation_config.no_repeat_ngram_size = 3
    with pytest.raises(OnnxExportRefused, match=r"no_repeat_ngram_size=3.*--format remote"):
        export_onnx(saved(model, tokenizer, tmp_path / "m"), tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()


def test_export_check_refuses_graphs_that_differ_and_writes_nothing(tokenizer, tmp_path, monkeypatch):
    import attention_seq2seq.hub.export_onnx as export_module

    model = build("rnn:bahdanau-gru", len(tokenizer))
    folder = saved(model, tokenizer, tmp_path / "m")
    monkeypatch.setattr(export_module, "CHECK_TOLERANCE", -1.0)  # no difference passes
    with pytest.raises(ExportError, match=r"encoder\.onnx differs from the PyTorch model by"):
        export_onnx(folder, tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()
    assert not list(tmp_path.glob(".onnx.*"))  # no staging folder left behind


def test_export_records_the_check_and_ships_a_runtime(tokenizer, tmp_path):
    model = build("rnn:luong-general-feed-local-p-lstm", len(tokenizer))
    folder = export_onnx(saved(model, tokenizer, tmp_path / "m"), tmp_path / "onnx", sentences=sources(5))
    marker = json.loads((folder / "attention_seq2seq_onnx.json").read_text())
    assert marker["check"]["sentences"] == 5 and marker["check"]["decoder"] <= 1e-4
    assert marker["interface"]["state"] == ["hidden", "cell", "attentional_state"]
    assert (folder / "onnx_runtime.py").read_text() == Path(
        sys.modules["attention_seq2seq.translation.onnx_runtime"].__file__
    ).read_text()
    assert not (folder / "export.log").exists()


def test_int8_export_quantizes_and_translates(tokenizer, tmp_path):
    import onnx

    model = build("transformer:post-sinusoidal", len(tokenizer))
    folder = export_onnx(saved(model, tokenizer, tmp_path / "m"), tmp_path / "onnx", quantization="int8")
    ops = {node.op_type for node in onnx.load(str(folder / "decoder.onnx")).graph.node}
    assert ops & {"MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul"}, ops
    found = OnnxSeq2Seq(folder).generate([tokenizer(sources(1)[0])["input_ids"]], num_beams=2, max_new_tokens=8)
    assert found[0][0].tokens and found[0][0].score < 0


def test_export_command_line_and_its_one_line_refusals(tokenizer, tmp_path, capsys):
    folder = saved(build("rnn:none-gru-last", len(tokenizer)), tokenizer, tmp_path / "m")
    check = tmp_path / "check.txt"
    check.write_text("\n".join(sources(3)) + "\n", encoding="utf-8")
    argv = ["export", str(folder), "-o", str(tmp_path / "onnx"), "--format", "onnx", "--check-sentences", str(check)]
    assert main(argv) == 0
    assert json.loads((tmp_path / "onnx" / "attention_seq2seq_onnx.json").read_text())["check"]["sentences"] == 3
    capsys.readouterr()
    assert main([*argv[:-2], "--quantization", "int16", "--overwrite"]) == 2
    assert "--quantization 'int16' for --format onnx: choose one of float32, int8" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# The commands on an export


@pytest.fixture(scope="module")
def exported(tokenizer, tmp_path_factory):
    """A Transformer saved as a model folder and its ONNX export."""
    root = tmp_path_factory.mktemp("onnx-commands")
    model = build("transformer:pre-learned", len(tokenizer))
    model.generation_config.max_new_tokens = 20
    model_dir = saved(model, tokenizer, root / "model")
    return model_dir, export_onnx(model_dir, root / "onnx")


def _translate(model: Path, source: Path, output: Path, *options: str) -> list[str]:
    argv = ["translate", "-m", str(model), "--input", str(source), "--output", str(output), "--no-progress"]
    assert main([*argv, *options]) == 0
    return output.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("options", [("--num-beams", "4"), ("--greedy",), ("--num-beams", "3", "--batch-tokens", "60")])
def test_translate_with_an_export_gives_the_pytorch_lines(exported, tmp_path, options, monkeypatch):
    model_dir, onnx_dir = exported
    source = tmp_path / "src.txt"
    lines = sources(9)
    lines[4] = ""  # an empty line stays empty
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for layout in ("intra", "inter"):
        monkeypatch.setenv("ATTENTION_SEQ2SEQ_ONNX_THREADS", layout)
        ours = _translate(onnx_dir, source, tmp_path / f"onnx-{layout}.txt", *options)
        assert ours == _translate(model_dir, source, tmp_path / "torch.txt", *options), layout
    assert ours[4] == ""


def test_onnx_thread_layout_is_inter_by_default_and_one_option_changes_it(exported, monkeypatch):
    from attention_seq2seq.translation.onnx_backend import load_onnx

    _, onnx_dir = exported
    monkeypatch.delenv("ATTENTION_SEQ2SEQ_ONNX_THREADS", raising=False)
    model, _ = load_onnx(onnx_dir, threads=2)
    assert (model.thread_layout, model.layout_reason, model.threads) == ("inter", "the default", 2)
    monkeypatch.setenv("ATTENTION_SEQ2SEQ_ONNX_THREADS", "intra")
    model, _ = load_onnx(onnx_dir, threads=2)
    assert (model.thread_layout, model.layout_reason) == ("intra", "ATTENTION_SEQ2SEQ_ONNX_THREADS=intra")
    assert load_onnx(onnx_dir, threads=2, thread_layout="inter")[0].thread_layout == "inter"  # the keyword wins
    monkeypatch.setenv("ATTENTION_SEQ2SEQ_ONNX_THREADS", "auto")
    with pytest.raises(UserError, match=r"^ATTENTION_SEQ2SEQ_ONNX_THREADS=auto: .*ONNX export is inter or intra$"):
        load_onnx(onnx_dir, threads=2)


def test_n_best_scores_of_an_export_match_the_pytorch_model(exported, tmp_path):
    """The TSV of --n-best 3 --scores: the same rows, texts identical, scores within 1e-3."""
    model_dir, onnx_dir = exported
    source = tmp_path / "src.txt"
    source.write_text("\n".join(sources(5)) + "\n", encoding="utf-8")
    options = ("--n-best", "3", "--num-beams", "3", "--scores")
    ours = [line.split("\t") for line in _translate(onnx_dir, source, tmp_path / "onnx.tsv", *options)]
    theirs = [line.split("\t") for line in _translate(model_dir, source, tmp_path / "torch.tsv", *options)]
    assert len(ours) == len(theirs) == 15
    for a, b in zip(ours, theirs):
        assert [x for x in a if not _is_number(x)] == [y for y in b if not _is_number(y)]
        numbers = [(float(x), float(y)) for x, y in zip(a, b) if _is_number(x) and "." in x]
        assert numbers and all(abs(x - y) < 1e-3 for x, y in numbers), (a, b)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_evaluate_with_an_export_scores_what_the_pytorch_model_scores(exported, tmp_path):
    model_dir, onnx_dir = exported
    pairs = read_pairs(8, split="val")
    src, ref = tmp_path / "t.src", tmp_path / "t.ref"
    src.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    ref.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    results = {}
    for name, model in (("onnx", onnx_dir), ("torch", model_dir)):
        out = tmp_path / f"{name}.json"
        argv = [
            "evaluate",
            "-m",
            str(model),
            "--src",
            str(src),
            "--ref",
            str(ref),
            "--output",
            str(out),
            "--no-progress",
        ]
        assert main([*argv, "--hypotheses", str(tmp_path / f"{name}.hyp")]) == 0
        results[name] = json.loads(out.read_text())["t"]["bleu"]
    assert results["onnx"] == results["torch"]
    assert (tmp_path / "onnx.hyp").read_text() == (tmp_path / "torch.hyp").read_text()


def _one_line_error(capsys, argv: list[str]) -> str:
    return one_line_error(capsys, main, argv)


def test_what_an_export_cannot_do_is_refused_in_one_line(exported, tmp_path, capsys):
    _, onnx_dir = exported
    source = tmp_path / "src.txt"
    source.write_text("ein satz\n", encoding="utf-8")
    base = ["translate", "-m", str(onnx_dir), "--input", str(source), "--no-progress"]
    assert "attention weights" in _one_line_error(capsys, [*base, "--alignments", str(tmp_path / "a.txt")])
    assert "--do-sample needs the PyTorch model" in _one_line_error(capsys, [*base, "--do-sample"])
    terms = tmp_path / "terms.tsv"
    terms.write_text("satz\n", encoding="utf-8")
    refused = _one_line_error(capsys, [*base, "--num-beams", "2", "--constraints", str(terms)])
    assert "--constraints needs the PyTorch model" in refused and "an ONNX export cannot take it" in refused
    assert "max_position_embeddings=160" in _one_line_error(capsys, [*base, "--max-new-tokens", "500"])
    foreign = tmp_path / "optimum-export"
    foreign.mkdir()
    (foreign / "encoder_model.onnx").write_bytes(b"not ours")
    (foreign / "config.json").write_text('{"model_type": "marian"}')
    message = _one_line_error(capsys, ["translate", "-m", str(foreign), "--input", str(source)])
    assert "no attention_seq2seq_onnx.json" in message and "--format onnx" in message


def test_shipped_runtime_runs_without_pytorch(exported, tmp_path):
    """``python onnx_runtime.py FOLDER`` with torch made unimportable gives the package's lines."""
    _, onnx_dir = exported
    lines = sources(6)
    source = tmp_path / "src.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    expected = _translate(onnx_dir, source, tmp_path / "pkg.txt", "--num-beams", "4")
    script = (
        "import runpy, sys\n"
        "sys.modules['torch'] = None\n"  # any `import torch` now fails
        "sys.modules['transformers'] = None\n"
        f"sys.argv = ['onnx_runtime.py', {str(onnx_dir)!r}, '--num-beams', '4']\n"
        f"runpy.run_path({str(onnx_dir / 'onnx_runtime.py')!r}, run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == expected


def test_min_new_tokens_forces_the_length_as_generate_does(tokenizer, tmp_path):
    model = build("rnn:bahdanau-lstm-coverage", len(tokenizer))
    folder = export_onnx(saved(model, tokenizer, tmp_path / "m"), tmp_path / "onnx")
    runner = OnnxSeq2Seq(folder)
    texts = sources(5)
    rows = [tokenizer(text)["input_ids"] for text in texts]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    for beams in (1, 3):
        with torch.no_grad():
            reference = model.generate(**batch, num_beams=beams, min_new_tokens=9, max_new_tokens=14)
        found = runner.generate(rows, num_beams=beams, min_new_tokens=9, max_new_tokens=14)
        assert hypotheses_tokens(found, eos, pad) == generated(reference, eos, pad)
        assert all(len(h[0].tokens) >= 9 for h in found)
