"""Tests of hub/export_native.py and hub/export_ct2.py: deploying without remote code.

Per native layout (post-norm + sinusoidal → Marian, pre-norm + sinusoidal → Pegasus, pre-norm +
learned → Blenderbot) a tiny random Transformer is exported with
``attention-seq2seq export --format native``; a fresh Python process in which ``attention_seq2seq``
cannot be imported loads it with ``trust_remote_code=False`` and must reproduce our logits (within
1e-4) and our beam-5 output. Every refused setting must give one line naming it and pointing to
``--format remote``. The CTranslate2 export must reproduce our greedy and beam-5 output in float32
and run in int8, through ``attention-seq2seq translate`` and ``evaluate``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attention_seq2seq as pkg
from attention_seq2seq.cli import main as cli_main
from attention_seq2seq.common.errors import UserError
from attention_seq2seq.hub.export_native import (
    LAYOUTS,
    NativeExportRefused,
    build_native_model,
    max_logit_difference,
    native_layout,
    sin_first_permutation,
)
from attention_seq2seq.translation.engine import token_budget_batches
from attention_seq2seq.translation.loading import LoadedModel, ModelLocation, translate_n_best
from attention_seq2seq.modeling.modeling_transformer_seq2seq import sinusoidal_position_encoding
from helpers import build_tokenizer, float32_rounding, read_pairs

SOURCES = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee, während ein Kind zusieht.",
    "Eine Frau liest.",
    "Ein kleines Mädchen in einem rosa Kleid springt über eine Pfütze.",
]
# (layout name, our config settings)
NATIVE_LAYOUTS = {
    "marian": dict(norm_order="post", position_embedding_type="sinusoidal"),
    "pegasus": dict(norm_order="pre", position_embedding_type="sinusoidal"),
    "blenderbot": dict(norm_order="pre", position_embedding_type="learned"),
}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(read_pairs(300))


def _tiny_config(vocab_size: int, **settings) -> pkg.TransformerSeq2SeqConfig:
    return pkg.TransformerSeq2SeqConfig(
        vocab_size=vocab_size, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=24, dropout=0.0,
        max_position_embeddings=160, init_std=0.1, **settings,
    )  # fmt: skip


def _rounding(model, logits: torch.Tensor) -> float:
    """How far a native class's logits may lie from ours: the same products added in its own order
    in each layer of width d_model of the encoder and the decoder (helpers.float32_rounding)."""
    config = model.config
    return float32_rounding(logits, config.d_model, config.encoder_layers + config.decoder_layers)


def _tiny_model(tokenizer, **settings):
    """A tiny random Transformer (init_std 0.1: sentence-dependent beam output) whose
    LayerNorm gains and shifts are moved away from 1 and 0, so that a wrong mapping of them, or
    of any feature, would show; beam 5 and at most 12 new tokens by default."""
    torch.manual_seed(0)
    model = pkg.TransformerSeq2SeqForConditionalGeneration(_tiny_config(len(tokenizer), **settings)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" in name:
                parameter.normal_(1.0 if name.endswith("weight") else 0.0, 0.3)
    model.generation_config.num_beams = 5
    model.generation_config.max_new_tokens = 12
    return model


def _save_run(model, tokenizer, root: Path) -> Path:
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return root


@pytest.fixture(scope="module", params=list(NATIVE_LAYOUTS))
def native_export(request, tokenizer, tmp_path_factory):
    name = request.param
    model = _tiny_model(tokenizer, **NATIVE_LAYOUTS[name])
    root = _save_run(model, tokenizer, tmp_path_factory.mktemp(f"run_{name}"))
    out = tmp_path_factory.mktemp(f"native_{name}") / "export"
    assert cli_main(["export", str(root), "-o", str(out), "--format", "native", "--repo-id", f"me/tiny-{name}"]) == 0
    # The reference is our class loading the saved files (as the native side loads its own).
    ours = pkg.TransformerSeq2SeqForConditionalGeneration.from_pretrained(root / "model").eval()
    return name, ours, out


# ---------------------------------------------------------------------------- the mapping


def test_sin_first_permutation_turns_our_table_into_marians():
    """Our interleaved table, permuted, is the sin-first table Marian and Pegasus build."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    for d_model in (16, 6):
        marian = MarianSinusoidalPositionalEmbedding(40, d_model)
        ours = sinusoidal_position_encoding(40, d_model)
        torch.testing.assert_close(ours[:, sin_first_permutation(d_model)], marian.create_weight(), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "settings",
    [
        dict(norm_order="post", fix_norm=True),
        dict(norm_order="post", share_encoder_decoder_embeddings=False),
        dict(norm_order="pre", tie_word_embeddings=False, activation_function="gelu", scale_embedding=False),
        dict(norm_order="pre", position_embedding_type="learned", tie_word_embeddings=False),
    ],
    ids=["fixnorm-folded", "marian-unshared", "pegasus-untied-gelu-unscaled", "blenderbot-untied"],
)
def test_other_settings_map_exactly(tokenizer, settings):
    model = _tiny_model(tokenizer, **settings)
    native, layout = build_native_model(model)
    encoded = tokenizer(SOURCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        scale = model(**encoded, decoder_input_ids=encoded["input_ids"][:, :6]).logits  # logits' magnitude
    assert max_logit_difference(model, native, len(tokenizer)) <= _rounding(model, scale)
    with torch.no_grad():
        ours = model.generate(**encoded, num_beams=4, max_new_tokens=10)
        theirs = native.generate(**encoded, num_beams=4, max_new_tokens=10)
    assert torch.equal(ours, theirs), layout.model_class


# ---------------------------------------------------------------------------- the folder


def test_native_export_has_no_code_and_names_the_native_class(native_export):
    name, _, out = native_export
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "README.md"} <= files
    assert not any(f.endswith(".py") for f in files)
    config = json.loads((out / "config.json").read_text())
    assert "auto_map" not in config and "custom_pipelines" not in config
    assert config["model_type"] == name
    assert config["architectures"] == [LAYOUTS[name].model_class]
    assert config["scale_embedding"] is True and config["decoder_start_token_id"] == 1
    assert config.get("forced_eos_token_id") is None
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["num_beams"] == 5 and generation["decoder_start_token_id"] == 1
    card = (out / "README.md").read_text()
    assert LAYOUTS[name].model_class in card
    assert 'AutoModelForSeq2SeqLM.from_pretrained("me/tiny-' in card
    assert 'no `pipeline("translation")`' in card and "batch_decode" in card


_CHILD = r"""
import json, sys
sys.modules["attention_seq2seq"] = None  # the package must not be needed (nor found) here
args = json.loads(sys.argv[1])
import torch
torch.set_num_threads(1)
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
try:
    import attention_seq2seq  # noqa: F401
    raise SystemExit("attention_seq2seq is importable in the child process")
except ImportError:
    pass
folder = args["folder"]
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=False).eval()
encoded = tokenizer(args["sources"], padding=True, return_tensors="pt")
decoder_input_ids = torch.tensor(args["decoder_input_ids"])
with torch.no_grad():
    logits = model(**encoded, decoder_input_ids=decoder_input_ids).logits
    generated = model.generate(**encoded)  # the exported generation_config: beam 5
with open(args["result"], "w", encoding="utf-8") as f:
    json.dump({"class": type(model).__name__, "module": type(model).__module__,
               "input_ids": encoded["input_ids"].tolist(), "logits": logits.tolist(),
               "generated": generated.tolist(),
               "decoded": tokenizer.batch_decode(generated, skip_special_tokens=True)}, f)
"""


def test_native_export_loads_without_remote_code_or_the_package(native_export, tokenizer, tmp_path):
    name, ours, out = native_export
    torch.manual_seed(0)
    decoder_input_ids = torch.randint(4, len(tokenizer), (len(SOURCES), 6))
    decoder_input_ids[:, 0] = 1
    args = {"folder": str(out), "sources": SOURCES, "decoder_input_ids": decoder_input_ids.tolist(),
            "result": str(tmp_path / "result.json")}  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_MODULES_CACHE": str(tmp_path / "modules")}  # fmt: skip
    env.pop("PYTHONPATH", None)
    completed = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(args)], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    child = json.loads((tmp_path / "result.json").read_text())
    assert child["class"] == LAYOUTS[name].model_class
    assert child["module"].startswith(f"transformers.models.{name}.")
    assert not (tmp_path / "modules").exists() or not any((tmp_path / "modules").rglob("*.py"))

    encoded = tokenizer(SOURCES, padding=True, return_tensors="pt")
    assert child["input_ids"] == encoded["input_ids"].tolist()
    with torch.no_grad():
        logits = ours(**encoded, decoder_input_ids=decoder_input_ids).logits
        generated = ours.generate(**encoded)  # beam 5 from the generation config
    assert (torch.tensor(child["logits"]) - logits).abs().max().item() <= _rounding(ours, logits)
    assert child["generated"] == generated.tolist()
    assert len({tuple(row) for row in child["generated"]}) > 1  # outputs depend on the sentence
    assert child["decoded"] == tokenizer.batch_decode(generated, skip_special_tokens=True)


# ---------------------------------------------------------------------------- refusals

_REFUSALS = {
    "rnn": ({"model_type": "rnn_seq2seq"}, "model_type 'rnn_seq2seq' (the RNN family)"),
    "post-learned": (
        {"norm_order": "post", "position_embedding_type": "learned"},
        "norm_order='post' with position_embedding_type='learned'",
    ),
    "scale-norm": ({"norm_type": "scale_norm", "norm_order": "pre"}, "norm_type='scale_norm' (ScaleNorm)"),
    "layer-norm-eps": ({"layer_norm_eps": 1e-6}, "layer_norm_eps=1e-06"),
    "pegasus-unshared": (
        {"norm_order": "pre", "share_encoder_decoder_embeddings": False},
        "share_encoder_decoder_embeddings=False: PegasusForConditionalGeneration",
    ),
    "blenderbot-unshared": (
        {"norm_order": "pre", "position_embedding_type": "learned", "share_encoder_decoder_embeddings": False},
        "share_encoder_decoder_embeddings=False: BlenderbotForConditionalGeneration",
    ),
}


def _config_only_run(tmp_path: Path, settings: dict) -> Path:
    """A model folder whose config.json has ``settings`` (refusals read nothing else)."""
    config = {"model_type": "transformer_seq2seq", "norm_order": "post", "position_embedding_type": "sinusoidal",
              "norm_type": "layer_norm", "layer_norm_eps": 1e-5, "share_encoder_decoder_embeddings": True}  # fmt: skip
    config.update(settings)
    (tmp_path / "run" / "model").mkdir(parents=True)
    (tmp_path / "run" / "model" / "config.json").write_text(json.dumps(config))
    return tmp_path / "run"


@pytest.mark.parametrize("case", list(_REFUSALS))
def test_native_export_refuses_with_one_line(case, tmp_path, capsys):
    settings, named = _REFUSALS[case]
    run = _config_only_run(tmp_path, settings)
    assert cli_main(["export", str(run), "-o", str(tmp_path / "out"), "--format", "native"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert named in err and "--format remote" in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(NativeExportRefused):
        native_layout(json.loads((run / "model" / "config.json").read_text()))


@pytest.mark.parametrize(
    "settings,named",
    [({"model_type": "rnn_seq2seq"}, "(the RNN family)"), ({"norm_type": "scale_norm"}, "(ScaleNorm)")],
    ids=["rnn", "scale-norm"],
)
def test_ct2_export_refuses_with_one_line(settings, named, tmp_path, capsys):
    run = _config_only_run(tmp_path, settings)
    assert cli_main(["export", str(run), "-o", str(tmp_path / "out"), "--format", "ct2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err and "--format remote" in err, err


def test_quantization_needs_format_ct2(tmp_path, capsys):
    run = _config_only_run(tmp_path, {})
    with pytest.raises(SystemExit):
        cli_main(["export", str(run), "-o", str(tmp_path / "out"), "--quantization", "int8"])
    assert "--quantization only applies to --format ct2" in capsys.readouterr().err


# ---------------------------------------------------------------------------- CTranslate2


@pytest.fixture(scope="module", params=["post-sinusoidal", "pre-learned", "post-learned"])
def ct2_run(request, tokenizer, tmp_path_factory):
    pytest.importorskip("ctranslate2")
    norm_order, positions = request.param.split("-")
    model = _tiny_model(tokenizer, norm_order=norm_order, position_embedding_type=positions)
    root = _save_run(model, tokenizer, tmp_path_factory.mktemp(f"ct2run_{request.param}"))
    exports = {}
    for quantization in ("float32", "int8"):
        out = tmp_path_factory.mktemp(f"ct2_{request.param}") / quantization
        assert cli_main(["export", str(root), "-o", str(out), "--format", "ct2", "--quantization", quantization]) == 0
        exports[quantization] = out
    return root, exports


def _loaded(path: Path):
    from attention_seq2seq.translation.loading import load_for_inference

    return load_for_inference(path, device="cpu")


@pytest.mark.parametrize("num_beams", [1, 5])
def test_ct2_float32_gives_our_translations(ct2_run, num_beams):
    root, exports = ct2_run
    sources = [s for s, _ in read_pairs(24, split="val")]
    ours = translate_n_best(_loaded(root), sources, batch_size=7, num_beams=num_beams, scores=False)
    ct2 = _loaded(exports["float32"])
    assert ct2.location.kind == "ctranslate2"
    theirs = translate_n_best(ct2, sources, batch_size=7, num_beams=num_beams)
    assert [h[0][0] for h in theirs] == [h[0][0] for h in ours]
    assert len({h[0][0] for h in ours}) > 1


def test_ct2_int8_translates_through_the_cli(ct2_run, tmp_path, capsys):
    _, exports = ct2_run
    sources = tmp_path / "src.txt"
    sources.write_text("\n".join(SOURCES[:2]) + "\n\n" + SOURCES[2] + "\n", encoding="utf-8")
    # One sentence per batch (--batch-tokens 1), so that each line's int8 numerics are those of the
    # engine translating it alone: a random tiny model's int8 translation may be empty (</s> first).
    assert cli_main(["translate", "-m", str(exports["int8"]), "--input", str(sources), "--num-beams", "3",
                     "--batch-tokens", "1", "--no-progress"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.split("\n")
    assert len(lines) == 5 and lines[2] == "" and lines[4] == ""  # empty line kept, output line-aligned
    alone = [translate_n_best(_loaded(exports["int8"]), [s], num_beams=3)[0][0][0] for s in SOURCES[:3]]
    assert [lines[0], lines[1], lines[3]] == alone


def test_ct2_n_best_matches_our_beam_hypotheses(ct2_run, capsys):
    root, exports = ct2_run
    outputs = {}
    for model in (root, exports["float32"]):
        assert cli_main(["translate", "-m", str(model), "--n-best", "3", "--scores", "--num-beams", "4",
                         *SOURCES[:2]]) == 0  # fmt: skip
        # TSV: source index, rank, hypothesis, total log-probability, the beam's normalised score
        outputs[model] = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    ours, theirs = outputs[root], outputs[exports["float32"]]
    assert [row[0] for row in ours] == ["0", "0", "0", "1", "1", "1"]
    assert [row[:3] for row in theirs] == [row[:3] for row in ours]
    for a, b in zip(ours, theirs):  # both: log p(y | x) / |y|^length_penalty
        assert float(a[4]) == pytest.approx(float(b[4]), abs=2e-3)


def test_ct2_folder_is_evaluated(ct2_run, tmp_path, capsys):
    _, exports = ct2_run
    pairs = read_pairs(12, split="val")
    (tmp_path / "t.de").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (tmp_path / "t.en").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    out = tmp_path / "scores.json"
    assert cli_main(["evaluate", "-m", str(exports["float32"]), "--src", str(tmp_path / "t.de"),
                     "--ref", str(tmp_path / "t.en"), "-o", str(out), "--no-progress", "--greedy"]) == 0  # fmt: skip
    result = json.loads(out.read_text())["t"]
    assert result["num_sentences"] == 12 and result["num_beams"] == 1 and 0.0 <= result["bleu"] <= 100.0


def test_plot_attention_refuses_a_ct2_folder(ct2_run, tmp_path, capsys):
    _, exports = ct2_run
    assert cli_main(["plot-attention", "-m", str(exports["int8"]), "--source", SOURCES[0],
                     "-o", str(tmp_path / "a.png")]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "CTranslate2 folder, which returns no attention" in err


def test_ct2_folder_holds_the_tokenizer_and_decoding_defaults(ct2_run):
    _, exports = ct2_run
    folder = exports["int8"]
    files = {p.name for p in folder.iterdir()}
    assert {
        "model.bin",
        "config.json",
        "tokenizer.json",
        "generation_config.json",
        "attention_seq2seq_ct2.json",
    } <= files
    config = json.loads((folder / "config.json").read_text())
    assert config["decoder_start_token"] == "<s>" and config["add_source_eos"] is False
    assert json.loads((folder / "attention_seq2seq_ct2.json").read_text())["quantization"] == "int8"


# ---------------------------------------------------------------------------- batching


def test_token_batches_respect_the_budget():
    lengths = [9, 7, 7, 4, 3, 30]
    batches = token_budget_batches(lengths, None, batch_tokens=16)
    assert batches == [[5], [0], [1, 2], [3, 4]]
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches[1:]:
        assert max(lengths[i] for i in batch) * len(batch) <= 16


def test_batching_by_tokens_gives_the_same_translations(tokenizer):
    model = _tiny_model(tokenizer, norm_order="pre")
    loaded = LoadedModel(model=model, tokenizer=tokenizer, location=ModelLocation("memory", "model-folder"))
    sources = [s for s, _ in read_pairs(10, split="val")]
    by_sentences = translate_n_best(loaded, sources, batch_size=3, num_beams=2, scores=False)
    by_tokens = translate_n_best(loaded, sources, max_batch_tokens=40, num_beams=2, scores=False)
    assert by_tokens == by_sentences


# --- CTranslate2's thread layout (translation/ct2.py) ---


def test_ct2_thread_layout_is_inter_by_default_and_one_option_changes_it(ct2_run, monkeypatch):
    """Documented default: ``threads`` batches side by side, one thread each; the variable or the
    keyword takes all threads into one batch (the keyword wins); nothing is timed."""
    from attention_seq2seq.translation import ct2 as inference_ct2

    _, exports = ct2_run
    monkeypatch.delenv("ATTENTION_SEQ2SEQ_CT2_THREADS", raising=False)
    model, _ = inference_ct2.load_ct2(exports["int8"], device="cpu", threads=2)
    assert (model.thread_layout.intra_threads, model.thread_layout.inter_threads) == (1, 2)
    assert model.thread_layout.name == "inter" and model.thread_layout.reason == "the default"
    monkeypatch.setenv("ATTENTION_SEQ2SEQ_CT2_THREADS", "intra")
    model, _ = inference_ct2.load_ct2(exports["int8"], device="cpu", threads=2)
    assert (model.thread_layout.intra_threads, model.thread_layout.inter_threads) == (2, 1)
    assert model.thread_layout.reason == "ATTENTION_SEQ2SEQ_CT2_THREADS=intra"
    model, _ = inference_ct2.load_ct2(exports["int8"], device="cpu", threads=3, thread_layout="inter")  # wins
    assert (model.thread_layout.intra_threads, model.thread_layout.inter_threads) == (1, 3)
    monkeypatch.setenv("ATTENTION_SEQ2SEQ_CT2_THREADS", "both")
    with pytest.raises(UserError, match=r"^ATTENTION_SEQ2SEQ_CT2_THREADS=both: .* is inter or intra$"):
        inference_ct2.load_ct2(exports["int8"], device="cpu", threads=2)
    with pytest.raises(UserError, match=r"^thread_layout=auto: .* is inter or intra$"):
        inference_ct2.load_ct2(exports["int8"], device="cpu", threads=2, thread_layout="auto")


def test_ct2_thread_layouts_translate_alike(ct2_run):
    """Both layouts give the same translations, n-best lists and scores."""
    from attention_seq2seq.translation import ct2 as inference_ct2

    _, exports = ct2_run
    sources = [s for s, _ in read_pairs(24, split="val")]
    found = {}
    for layout in ("intra", "inter"):
        model, tok = inference_ct2.load_ct2(exports["float32"], device="cpu", threads=2, thread_layout=layout)
        found[layout] = inference_ct2.translate_ct2(
            model, tok, sources, batch_size=4, num_beams=3, num_return_sequences=2
        )
    assert [[h for h, _ in n] for n in found["intra"]] == [[h for h, _ in n] for n in found["inter"]]
    for a, b in zip(found["intra"], found["inter"]):
        assert [s for _, s in a] == pytest.approx([s for _, s in b], abs=1e-5)
