"""Tests of hub/export.py and the shipped pipeline: a Hub folder that works with transformers alone.

The central test per model family runs a fresh Python process in which ``attention_seq2seq``
cannot be imported, offline, with an empty modules cache, and checks that the Auto classes and
``pipeline("translation", trust_remote_code=True)`` reproduce the in-process model exactly.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open

import attention_seq2seq

from attention_seq2seq.cli import main as cli_main
from attention_seq2seq.hub.export import ExportError, export_model, strip_png_metadata
from attention_seq2seq.modeling.pipeline_translation import Seq2SeqTranslationPipeline
from attention_seq2seq.translation.constraints import constrained_decoding
from helpers import build_tokenizer, read_pairs, tiny_model

FAMILIES = ("rnn_seq2seq", "transformer_seq2seq")
SOURCES = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee, während ein Kind zusieht.",
    "Eine Frau liest.",
]
GENERATE = {"num_beams": 2, "max_new_tokens": 6}
# Per source sentence: target phrases (token ids) that constrained beam search must write.
CONSTRAINTS = [[[7]], [[8, 9], [10]], []]


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(read_pairs(300))


def _tiny_model(family: str, vocab_size: int):
    if family == "rnn_seq2seq":
        # init_range: large enough weights for sentence-dependent output from a tiny model
        return tiny_model(
            family,
            vocab_size,
            embedding_size=16,
            hidden_size=16,
            attention="luong",
            score="general",
            window="local-p",
            window_size=3,
            dropout=0.0,
            init_range=0.5,
        )
    return tiny_model(
        family,
        vocab_size,
        d_model=16,
        decoder_layers=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        dropout=0.0,
        max_position_embeddings=128,
        init_std=0.5,
    )  # init_std: as init_range above


def _png(width: int = 4, height: int = 3, text: dict[str, str] | None = None) -> bytes:
    """A small greyscale PNG, with tEXt chunks (e.g. a creation time) when ``text`` is given."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes((x * 40 + y * 20) % 256 for x in range(width)) for y in range(height))
    header = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
    texts = [chunk(b"tEXt", f"{k}\x00{v}".encode("latin-1")) for k, v in (text or {}).items()]
    return b"\x89PNG\r\n\x1a\n" + header + b"".join(texts) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _metrics(family: str) -> dict:
    return {
        "model_family": family,
        "corpus": {
            "spec": "multi30k:/data/multi30k",
            "name": "Multi30k task 1",
            "source_lang": "de",
            "target_lang": "en",
            "license": "non-commercial research",
            "attribution": "Elliott et al. 2016",
        },
        "train": {
            "steps": 15,
            "epochs": 1.0,
            "wall_time_s": 1.5,
            "target_tokens_per_s": 900.0,
            "final_train_loss": 4.2,
        },
        "validation": [{"step": 15, "loss": 4.5, "perplexity": 90.0, "bleu": 0.4, "chrf": 9.1}],
        "test": {
            "multi30k-test2016": {
                "split": "test",
                "num_sentences": 1000,
                "num_beams": 2,
                "bleu": 1.23,
                "chrf": 12.5,
                "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1",
                "chrf_signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.5.1",
            }
        },
    }


@pytest.fixture(scope="module", params=FAMILIES)
def trained(request, tmp_path_factory, tokenizer):
    """A fake training output folder (docs/DESIGN.md) with a tiny random model of each family."""
    family = request.param
    torch.manual_seed(0)
    model = _tiny_model(family, len(tokenizer)).eval()
    model.generation_config.num_beams = 1
    model.generation_config.max_new_tokens = 8
    root = tmp_path_factory.mktemp(f"train_{family}")
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    (root / "metrics.json").write_text(json.dumps(_metrics(family), indent=2), encoding="utf-8")
    (root / "recipe.yaml").write_text(
        yaml.safe_dump({"model": {"family": family, "hidden_size": 16}, "optim": {"lr": 0.01, "steps": 15}}),
        encoding="utf-8",
    )
    (root / "plots").mkdir()
    (root / "plots" / "attention_test_0.png").write_bytes(_png(text={"Creation Time": "2026-11-30T08:00:00"}))
    return family, root, model


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    family, root, model = trained
    out = tmp_path_factory.mktemp(f"export_{family}") / "hub"
    export_model(root, out, repo_id=f"someone/tiny-{family}")
    return family, root, model, out


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------- layout


def test_export_writes_weights_config_code_card_and_image(exported):
    family, root, model, out = exported
    modeling = "modeling_rnn_seq2seq" if family == "rnn_seq2seq" else "modeling_transformer_seq2seq"
    configuration = modeling.replace("modeling_", "configuration_")
    files = set(_files(out))
    expected = {
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
        f"{modeling}.py", f"{configuration}.py", "pipeline_translation.py", "README.md",
        "attention_heatmap.png", "metrics.json", "recipe.yaml",
    }  # fmt: skip
    assert expected <= files
    assert not any(name.endswith(".bin") or name.endswith(".pyc") for name in files)

    config = json.loads((out / "config.json").read_text())
    class_prefix = "RNNSeq2Seq" if family == "rnn_seq2seq" else "TransformerSeq2Seq"
    assert config["auto_map"] == {
        "AutoConfig": f"{configuration}.{class_prefix}Config",
        "AutoModel": f"{modeling}.{class_prefix}Model",
        "AutoModelForSeq2SeqLM": f"{modeling}.{class_prefix}ForConditionalGeneration",
    }
    for task in ("translation", "text2text-generation"):
        assert config["custom_pipelines"][task]["impl"] == "pipeline_translation.Seq2SeqTranslationPipeline"
        assert config["custom_pipelines"][task]["pt"] == ["AutoModelForSeq2SeqLM"]

    shipped = (out / f"{modeling}.py").read_text()
    assert f"from .{configuration} import" in shipped
    assert "from .." not in shipped

    # The weights are the trained model's, bit for bit.
    state = model.state_dict()
    with safe_open(out / "model.safetensors", framework="pt") as weights:
        for name in weights.keys():
            assert torch.equal(weights.get_tensor(name), state[name]), name

    # The card image lost its timestamp chunk and nothing else.
    image = (out / "attention_heatmap.png").read_bytes()
    assert b"tEXt" not in image and b"Creation Time" not in image
    assert image == strip_png_metadata((root / "plots" / "attention_test_0.png").read_bytes())


def test_export_twice_gives_identical_bytes_and_reexport_roundtrips(exported, tmp_path):
    family, root, _, out = exported
    again = export_model(root, tmp_path / "again", repo_id=f"someone/tiny-{family}")
    assert _files(again) == _files(out)
    # An export is itself a valid source: its metrics, recipe and heat-map are picked up again.
    reexport = export_model(out, tmp_path / "reexport", repo_id=f"someone/tiny-{family}")
    assert _files(reexport) == _files(out)


# ---------------------------------------------------------------------------- remote code

_CHILD = r"""
import json, sys
sys.modules["attention_seq2seq"] = None  # the package must not be needed (nor found) here
args = json.loads(sys.argv[1])
import torch
torch.set_num_threads(1)
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

try:
    import attention_seq2seq  # noqa: F401
    raise SystemExit("attention_seq2seq is importable in the child process")
except ImportError:
    pass

folder = args["folder"]
config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
base = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
encoded = tokenizer(args["sources"], padding=True, return_tensors="pt")
decoder_input_ids = torch.tensor(args["decoder_input_ids"])
with torch.no_grad():
    logits = model(**encoded, decoder_input_ids=decoder_input_ids).logits
    hidden = base(**encoded, decoder_input_ids=decoder_input_ids).last_hidden_state
    generated = model.generate(**encoded, **args["generate"])
    # custom_generate/ (shipped by the export) made generate take terminology constraints
    constrained = model.generate(**encoded, num_beams=3, max_new_tokens=8, constraints=args["constraints"])
translator = pipeline("translation", model=folder, trust_remote_code=True)
text2text = pipeline("text2text-generation", model=folder, trust_remote_code=True)
result = {
    "config_module": type(config).__module__,
    "model_module": type(model).__module__,
    "pipeline_module": type(translator).__module__,
    "input_ids": encoded["input_ids"].tolist(),
    "logits": logits.tolist(),
    "hidden": hidden.tolist(),
    "generated": generated.tolist(),
    "constrained": constrained.tolist(),
    "decoded": tokenizer.batch_decode(generated, skip_special_tokens=True),
    "pipe_batched": translator(args["sources"], batch_size=2, **args["generate"]),
    "pipe_single": translator(args["sources"][0]),
    "pipe_attention": translator(args["sources"], batch_size=2, return_attention=True, max_new_tokens=5),
    "text2text": text2text(args["sources"][:2], max_new_tokens=5),
}
model.save_pretrained(args["resave"])
tokenizer.save_pretrained(args["resave"])
# The re-saved folder still serves the shipped pipeline (save_pretrained copied its file).
resaved_translator = pipeline("translation", model=args["resave"], trust_remote_code=True)
result["resaved_pipeline_module"] = type(resaved_translator).__module__
result["resaved_pipe_single"] = resaved_translator(args["sources"][0])
with open(args["result"], "w", encoding="utf-8") as f:
    json.dump(result, f)
"""


def _run_child(export_dir: Path, tmp_path: Path, decoder_input_ids: list) -> dict:
    args = {
        "folder": str(export_dir),
        "sources": SOURCES,
        "decoder_input_ids": decoder_input_ids,
        "generate": GENERATE,
        "constraints": CONSTRAINTS,
        "resave": str(tmp_path / "resaved"),
        "result": str(tmp_path / "result.json"),
    }
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_MODULES_CACHE": str(tmp_path / "modules_cache"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    env.pop("PYTHONPATH", None)
    completed = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(args)],
        cwd=tmp_path,  # not the repository root, whose folders would be importable
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads((tmp_path / "result.json").read_text(encoding="utf-8"))


def test_export_loads_as_remote_code_without_the_package(exported, tokenizer, tmp_path):
    family, root, trained_model, out = exported
    # The reference is the package's class loading the same files. (A model loaded from safetensors can
    # differ from the in-memory one it was saved from by ~1e-6 in float32, with identical parameters.)
    model = getattr(attention_seq2seq, type(trained_model).__name__).from_pretrained(out).eval()
    torch.manual_seed(0)
    decoder_input_ids = torch.randint(4, len(tokenizer), (len(SOURCES), 5))
    decoder_input_ids[:, 0] = model.config.decoder_start_token_id
    child = _run_child(out, tmp_path, decoder_input_ids.tolist())

    # The child ran the shipped code, not the package.
    for key in ("config_module", "model_module", "pipeline_module"):
        assert child[key].startswith("transformers_modules"), child[key]

    encoded = tokenizer(SOURCES, padding=True, return_tensors="pt")
    assert child["input_ids"] == encoded["input_ids"].tolist()
    base_class = getattr(attention_seq2seq, type(model).__name__.replace("ForConditionalGeneration", "Model"))
    base = base_class.from_pretrained(out).eval()
    with torch.no_grad():
        logits = model(**encoded, decoder_input_ids=decoder_input_ids).logits
        hidden = base(**encoded, decoder_input_ids=decoder_input_ids).last_hidden_state
        generated = model.generate(**encoded, **GENERATE)
    assert torch.equal(torch.tensor(child["logits"]), logits)
    assert torch.equal(torch.tensor(child["hidden"]), hidden)
    assert child["generated"] == generated.tolist()
    # Constrained beam search from the shipped custom_generate/ = the package's, and it keeps its promise.
    with torch.no_grad():
        constrained = model.generate(
            **encoded, num_beams=3, max_new_tokens=8, custom_generate=constrained_decoding, constraints=CONSTRAINTS
        )
    assert child["constrained"] == constrained.tolist()
    for row, phrases in zip(child["constrained"], CONSTRAINTS):
        for phrase in phrases:
            assert any(row[i : i + len(phrase)] == phrase for i in range(len(row))), (row, phrase)
    decoded = tokenizer.batch_decode(generated, skip_special_tokens=True)
    assert child["decoded"] == decoded
    assert len(set(decoded)) > 1  # outputs depend on the sentence, so a batch mix-up would show

    # The shipped pipeline gives what the in-process pipeline gives, in v4's output format.
    translator = Seq2SeqTranslationPipeline(model=model, tokenizer=tokenizer, task="translation")
    assert child["pipe_batched"] == [{"translation_text": text} for text in decoded]
    assert child["pipe_single"] == translator(SOURCES[0])
    assert child["pipe_single"] == [{"translation_text": translator(SOURCES[0])[0]["translation_text"]}]
    assert child["pipe_attention"] == translator(SOURCES, batch_size=2, return_attention=True, max_new_tokens=5)
    assert [set(r) for r in child["text2text"]] == [{"generated_text"}, {"generated_text"}]
    assert child["resaved_pipeline_module"].startswith("transformers_modules")
    assert child["resaved_pipe_single"] == child["pipe_single"]

    # Re-exporting what the remote-code model saved gives the original export back.
    reexport = export_model(
        tmp_path / "resaved",
        tmp_path / "reexport",
        metrics=out / "metrics.json",
        recipe=out / "recipe.yaml",
        heatmap=out / "attention_heatmap.png",
        repo_id=f"someone/tiny-{family}",
    )
    assert _files(reexport) == _files(out)


# ---------------------------------------------------------------------------- pipeline


def test_pipeline_attention_is_the_models_cross_attention(trained, tokenizer):
    _, _, model = trained
    translator = Seq2SeqTranslationPipeline(model=model, tokenizer=tokenizer, task="translation")
    implementation = model.config._attn_implementation
    batched = translator(SOURCES, batch_size=3, return_attention=True, max_new_tokens=5)
    assert model.config._attn_implementation == implementation  # switched to eager for the call only
    # Rows are distributions, except under local-p attention, whose Gaussian is not renormalised.
    normalised = getattr(model.config, "window", None) != "local-p"
    for source, record in zip(SOURCES, batched):
        alignment = record["attention"]
        source_ids = tokenizer(source)["input_ids"]
        assert alignment["source_tokens"] == tokenizer.convert_ids_to_tokens(source_ids)  # padding cut off
        weights = torch.tensor(alignment["weights"])
        assert weights.shape == (len(alignment["target_tokens"]), len(source_ids))
        if normalised:
            torch.testing.assert_close(weights.sum(-1), torch.ones(len(weights)))
        assert bool((weights >= 0).all()) and bool((weights.sum(-1) <= 1 + 1e-5).all())

        # The same weights from a direct teacher-forced forward on the unpadded sentence.
        target_ids = tokenizer.convert_tokens_to_ids(alignment["target_tokens"])
        decoder_input_ids = torch.tensor([[model.config.decoder_start_token_id, *target_ids[:-1]]])
        model.set_attn_implementation("eager")
        try:
            with torch.no_grad():
                outputs = model(
                    input_ids=torch.tensor([source_ids]), decoder_input_ids=decoder_input_ids, output_attentions=True
                )
        finally:
            model.set_attn_implementation(implementation)
        expected = outputs.cross_attentions[-1][0].mean(0)
        torch.testing.assert_close(weights, expected, atol=1e-5, rtol=1e-4)
        assert record["translation_text"] == translator(source, max_new_tokens=5)[0]["translation_text"]


def test_pipeline_options(trained, tokenizer):
    _, _, model = trained
    translator = Seq2SeqTranslationPipeline(model=model, tokenizer=tokenizer, task="translation", max_new_tokens=3)
    several = translator(SOURCES[:2], num_beams=3, num_return_sequences=2)
    assert [len(records) for records in several] == [2, 2]
    with_ids = translator(SOURCES[0], return_tensors=True, return_text=False)
    assert set(with_ids[0]) == {"translation_token_ids"}
    assert len(with_ids[0]["translation_token_ids"]) <= 1 + 3  # the construction-time max_new_tokens holds
    assert translator([]) == []

    # Generation options pass through to generate(): sampling under a seed gives generate()'s sample.
    encoded = tokenizer(SOURCES[1], return_tensors="pt")
    torch.manual_seed(7)
    sampled = model.generate(**encoded, do_sample=True, top_k=20, num_beams=1, max_new_tokens=4)
    torch.manual_seed(7)
    record = translator(SOURCES[1], do_sample=True, top_k=20, num_beams=1, max_new_tokens=4, return_tensors=True)[0]
    assert record["translation_token_ids"].tolist() == sampled[0].tolist()
    assert record["translation_text"] == tokenizer.decode(sampled[0], skip_special_tokens=True)

    # Several sequences per input, each with its own alignment.
    aligned = translator(SOURCES[:2], num_beams=2, num_return_sequences=2, return_attention=True)
    for records in aligned:
        for record in records:
            weights = record["attention"]["weights"]
            assert len(weights) == len(record["attention"]["target_tokens"]) > 0
    with pytest.raises(TypeError, match="num_beam"):
        translator(SOURCES[0], num_beam=2)
    with pytest.raises(TypeError, match="string"):
        translator([1, 2])


# ---------------------------------------------------------------------------- refusals


def test_export_refuses_to_overwrite_and_replaces_only_when_asked(trained, tmp_path, capsys):
    _, root, _ = trained
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not empty.*overwrite"):
        export_model(root, target)
    assert cli_main(["export", str(root), "-o", str(target)]) == 2  # the command line: one line, no traceback
    err = capsys.readouterr().err
    assert err.startswith("attention-seq2seq export: error: export folder") and err.count("\n") == 1
    assert (target / "keep.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["target"]  # no partial folder left behind

    with pytest.raises(ExportError, match="overlaps"):
        export_model(root, root / "inside", overwrite=True)
    with pytest.raises(ExportError, match="neither a training output folder"):
        export_model(tmp_path / "missing", tmp_path / "out")

    export_model(root, target, overwrite=True)
    assert not (target / "keep.txt").exists() and (target / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]


def test_export_rejects_a_foreign_model_type(tmp_path):
    (tmp_path / "bart").mkdir()
    (tmp_path / "bart" / "config.json").write_text(json.dumps({"model_type": "bart"}))
    with pytest.raises(ExportError, match="model_type 'bart'.*'rnn_seq2seq' or 'transformer_seq2seq'"):
        export_model(tmp_path / "bart", tmp_path / "out")


# ---------------------------------------------------------------------------- PNG


def test_strip_png_metadata_keeps_pixels_and_drops_text():
    plain = _png()
    stamped = _png(text={"Software": "matplotlib", "Creation Time": "today"})
    assert stamped != plain
    assert strip_png_metadata(stamped) == plain
    assert strip_png_metadata(plain) == plain
    with pytest.raises(ExportError, match="not a PNG"):
        strip_png_metadata(b"GIF89a....", "plot.gif")
    corrupt = bytearray(plain)
    corrupt[40] ^= 0xFF
    with pytest.raises(ExportError, match="corrupt PNG"):
        strip_png_metadata(bytes(corrupt), "plot.png")


# ---------------------------------------------------------------------------- transformers' sharing route

_REMOTE_CODE_CHILD = r"""
import json, sys
sys.modules["attention_seq2seq"] = None  # the package must not be needed (nor found) here
import torch
from transformers import AutoModelForSeq2SeqLM

folder, input_ids, decoder_input_ids = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
with torch.no_grad():
    logits = model(input_ids=torch.tensor(input_ids), decoder_input_ids=torch.tensor(decoder_input_ids)).logits
print(json.dumps({"module": type(model).__module__, "logits": logits.tolist()}))
"""


def _tiny_registered_model(family: str):
    sizes = dict(embedding_size=6) if family == "rnn_seq2seq" else {}
    return tiny_model(family, 23, seed=0, **sizes).eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_register_for_auto_class_then_save_pretrained_writes_a_remote_code_folder(family, tmp_path):
    """transformers' custom-model route: register_for_auto_class() + save_pretrained() raised
    FileNotFoundError (the modeling file's `..configuration` import). Now the folder holds the
    flattened code, auto_map and the pipeline, and loads with trust_remote_code=True in a process
    where the package cannot be imported, giving the same logits; weights are 0644 like the rest."""
    model = _tiny_registered_model(family)
    model_cls = type(model)
    model_cls.register_for_auto_class("AutoModelForSeq2SeqLM")
    try:
        model.save_pretrained(tmp_path / "shared")
    finally:
        del model_cls._auto_class  # the class is shared with the other tests
    folder = tmp_path / "shared"
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"].startswith(f"modeling_{family}.")
    assert "translation" in config["custom_pipelines"]
    assert (folder / "pipeline_translation.py").is_file() and (folder / f"configuration_{family}.py").is_file()
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in folder.iterdir()}["model.safetensors"] == oct(
        (folder / "config.json").stat().st_mode & 0o777
    )

    input_ids, decoder_input_ids = [[5, 6, 7, 2]], [[1, 8, 9]]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules_cache")}
    env.pop("PYTHONPATH", None)
    completed = subprocess.run(
        [sys.executable, "-c", _REMOTE_CODE_CHILD, str(folder), json.dumps(input_ids), json.dumps(decoder_input_ids)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    child = json.loads(completed.stdout.strip().splitlines()[-1])
    assert child["module"].startswith("transformers_modules")
    with torch.no_grad():
        expected = model(input_ids=torch.tensor(input_ids), decoder_input_ids=torch.tensor(decoder_input_ids)).logits
    torch.testing.assert_close(torch.tensor(child["logits"]), expected, rtol=1e-5, atol=1e-5)


def test_save_pretrained_gives_the_weights_the_mode_of_the_other_files(tmp_path):
    """safetensors writes 0600; a plain save_pretrained folder now has one mode for every file."""
    _tiny_registered_model("rnn_seq2seq").save_pretrained(tmp_path)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes["model.safetensors"] == modes["config.json"] == modes["generation_config.json"]
