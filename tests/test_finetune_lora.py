"""``attention-seq2seq finetune --lora`` (training/finetune_trainer.py, peft's LoRA).

Both families start from the tiny trained runs of tests/helpers.py (helpers' "tiny" sizes, a
unigram tokenizer on a corpus slice) and fine-tune adapters on other pairs of the same corpus.
Checked: the loss falls, only adapter parameters change, the merged model gives the adapted
model's teacher-forced logits to float32 rounding and exports, a run without --merge can be merged later,
runs resume from their checkpoints and are never overwritten, and bad settings fail in one line.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import FAMILIES, build_tiny_run, float32_rounding, read_pairs, tiny_model, write_jsonl

from attention_seq2seq.cli import main
from attention_seq2seq.training import finetune_trainer as ft
from attention_seq2seq.training import lora
from attention_seq2seq.training.config import FinetuneConfig

peft = pytest.importorskip("peft")

STEPS = 20


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.getbasetemp() / "cli-tiny-runs"  # test_finetune_trainer.py's, shared
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """Pairs the base models never saw (they trained on the first 300), a dev and a test set."""
    folder = tmp_path_factory.mktemp("lora-data")
    return {
        "train": write_jsonl(folder / "train.jsonl", read_pairs(160, offset=1000)),
        "validation": write_jsonl(folder / "dev.jsonl", read_pairs(8, split="val")),
        "test": write_jsonl(folder / "test.jsonl", read_pairs(8, split="test")),
    }


def _argv(base: Path, output_dir: Path, data: dict[str, Path], **options) -> list[str]:
    values = dict(
        base_model=str(base),
        output_dir=str(output_dir),
        train_file=str(data["train"]),
        validation_file=str(data["validation"]),
        test_file=str(data["test"]),
        max_steps=STEPS,
        per_device_train_batch_size=16,
        learning_rate=0.05,
        warmup_steps=0,
        label_smoothing=0.0,
        eval_steps=STEPS,
        logging_steps=1,
        save_total_limit=1,
        generation_num_beams=1,
        generation_max_new_tokens=12,
        seed=0,
        lora_r=8,
        lora_alpha=16,
        lora_dropout=0.0,
    )
    values.update(options)
    argv = ["finetune", "--lora"]
    for name, value in values.items():
        if isinstance(value, bool):
            argv.append(("--" if value else "--no-") + name.replace("_", "-"))
        else:
            argv += ["--" + name.replace("_", "-"), str(value)]
    return argv


def _parameters_at_train_end(monkeypatch) -> dict:
    """Patch `build_trainer` so that each trainer records its model's parameters (by name, as
    cloned tensors) when training ends, before the run merges the adapters in place."""
    from transformers import TrainerCallback

    recorded: dict = {}
    build = ft.build_trainer

    class Record(TrainerCallback):
        def on_train_end(self, args, state, control, model=None, **kwargs):
            recorded.update({name: p.detach().clone() for name, p in model.named_parameters()})

    def recording_build_trainer(*args, **kwargs):
        trainer = build(*args, **kwargs)
        trainer.add_callback(Record())
        return trainer

    monkeypatch.setattr(ft, "build_trainer", recording_build_trainer)
    return recorded


@pytest.fixture(scope="module")
def lora_runs(runs_root, data, tmp_path_factory) -> dict[str, dict]:
    """Each family LoRA-fine-tuned and merged through `attention-seq2seq finetune --lora --merge`,
    with the parameters the trainer held when training ended."""
    out = {}
    root = tmp_path_factory.mktemp("lora-runs")
    # Module fixtures start before conftest's per-test single thread: two threads on a shared
    # 2-core machine make each tiny backward pass ~10x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for family in FAMILIES:
            base = build_tiny_run(family, runs_root)
            with pytest.MonkeyPatch.context() as monkeypatch:
                parameters = _parameters_at_train_end(monkeypatch)
                assert main(_argv(base, root / family, data, merge=True)) == 0
            out[family] = {"base": base, "run": root / family, "parameters": parameters}
    finally:
        torch.set_num_threads(threads)
    return out


def _teacher_forced_batch(tokenizer, pairs) -> dict:
    batch = tokenizer(
        [s for s, _ in pairs], text_target=[t for _, t in pairs], padding=True, truncation=True, return_tensors="pt"
    )
    batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    return dict(batch)


def _logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(**batch).logits


def _load(folder: Path):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    return AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def _merge_tolerance(model, logits: torch.Tensor) -> float:
    """How far merging may move the logits: the merged model computes (W + s·BA)x where the adapted
    one computes Wx + s·B(Ax), the same products added in another order, in each layer of width
    K (d_model or hidden_size) of the encoder and the decoder (helpers.float32_rounding)."""
    config = model.config
    width = getattr(config, "d_model", None) or config.hidden_size
    return float32_rounding(logits, width, layers=config.encoder_layers + config.decoder_layers)


def _adapted(base: Path, adapter: Path):
    model, tokenizer = _load(base / "model")
    return peft.PeftModel.from_pretrained(model, str(adapter)).eval(), tokenizer


# ------------------------------------------------------------------------------------------------
# Which modules get adapters


def test_default_targets_are_the_attention_projections_and_rnn_output_layers():
    from torch import nn

    transformer = tiny_model("transformer_seq2seq", 40, encoder_layers=2, decoder_layers=2)
    targets = lora.default_lora_targets(transformer)
    # q/k/v/out of 2 encoder self-attentions and 2 decoder self- and cross-attentions
    assert len(targets) == 4 * 2 + 8 * 2
    assert {t.rsplit(".", 1)[-1] for t in targets} == {"q_proj", "k_proj", "v_proj", "out_proj"}
    assert any(".encoder_attn." in t for t in targets) and any(".encoder." in t for t in targets)

    bahdanau = tiny_model("rnn_seq2seq", 40, attention="bahdanau", coverage=True, cell_type="lstm")
    assert lora.default_lora_targets(bahdanau) == [
        "model.decoder.attention.q_proj",
        "model.decoder.attention.k_proj",
        "model.decoder.attention.coverage_proj",
        "model.decoder.deep_output",
    ]
    luong = tiny_model("rnn_seq2seq", 40, attention="luong", score="general")
    assert lora.default_lora_targets(luong) == ["model.decoder.attention.k_proj", "model.decoder.attn_combine"]
    local_p = tiny_model("rnn_seq2seq", 40, attention="luong", score="general", window="local-p")
    assert lora.default_lora_targets(local_p) == [
        "model.decoder.attention.k_proj",
        "model.decoder.attention.w_p",
        "model.decoder.attention.v_p",
        "model.decoder.attn_combine",
    ]
    for model in (transformer, bahdanau, luong, local_p):
        linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
        assert set(lora.default_lora_targets(model)) <= linears - {"lm_head"}


def test_target_patterns_are_suffix_lists_or_regexes():
    model = tiny_model("transformer_seq2seq", 40)
    assert lora.resolve_lora_targets(model, "encoder_attn.q_proj, fc2") == [
        "model.encoder.layers.0.feed_forward.fc2",
        "model.decoder.layers.0.encoder_attn.q_proj",
        "model.decoder.layers.0.feed_forward.fc2",
    ]
    assert lora.resolve_lora_targets(model, r".*decoder.*self_attn\.(q|v)_proj") == [
        "model.decoder.layers.0.self_attn.q_proj",
        "model.decoder.layers.0.self_attn.v_proj",
    ]


@pytest.mark.parametrize(
    "family, spec, message",
    [
        ("transformer_seq2seq", "q_proj,nope_proj", "lora_target_modules: 'nope_proj' matches no module; valid: "),
        ("transformer_seq2seq", "decoder\\.q_proj$", "lora_target_modules: the regex 'decoder\\\\.q_proj$' matches"),
        ("transformer_seq2seq", "(q_proj", "lora_target_modules: '(q_proj' is not a valid regex"),
        ("transformer_seq2seq", "lm_head", "lora_target_modules: lm_head shares its weight with model.shared"),
        ("transformer_seq2seq", "shared", "lora_target_modules: model.shared shares its weight with lm_head.weight"),
        ("rnn_seq2seq", "decoder.rnn", "lora_target_modules: model.decoder.rnn is a GRU; LoRA here adapts Linear"),
    ],
)
def test_bad_target_patterns_are_refused_by_name(family, spec, message):
    model = tiny_model(family, 40, **({"attention": "bahdanau"} if family == "rnn_seq2seq" else {}))
    with pytest.raises(lora.LoraSettingError) as error:
        lora.resolve_lora_targets(model, spec)
    text = str(error.value)
    assert text.startswith(message) and "\n" not in text
    assert "comma list of module-name suffixes or a regex" in text and "q_proj" in text  # what is valid


def test_an_untied_rnn_lm_head_may_be_targeted_explicitly():
    model = tiny_model("rnn_seq2seq", 40, attention="bahdanau")
    assert not model.config.tie_word_embeddings
    assert lora.resolve_lora_targets(model, "lm_head") == ["lm_head"]


# ------------------------------------------------------------------------------------------------
# A LoRA run, merged


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_trains_only_the_adapters(family, lora_runs):
    entry = lora_runs[family]
    metrics = json.loads((entry["run"] / "metrics.json").read_text())
    losses = [e["loss"] for e in metrics["train"]["loss_history"]]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.05, losses

    base, _ = _load(entry["base"] / "model")
    base_parameters = dict(base.named_parameters())
    after = entry["parameters"]
    adapters = {n: p for n, p in after.items() if ".lora_" in n}
    lora = metrics["lora"]
    assert len(adapters) == 2 * len(lora["target_modules"])
    assert lora["trainable_parameters"] == sum(p.numel() for p in adapters.values())
    assert lora["total_parameters"] == sum(p.numel() for p in base_parameters.values()) + lora["trainable_parameters"]
    # lora_B starts at zero: every B moved, so every adapter was used and trained.
    assert all(p.abs().max() > 0 for n, p in adapters.items() if ".lora_B." in n)
    # Every base weight is bitwise what it was (peft names it ...<module>.base_layer.<param>).
    frozen = {
        n.removeprefix("base_model.model.").replace(".base_layer.", "."): p
        for n, p in after.items()
        if ".lora_" not in n
    }
    assert frozen.keys() == base_parameters.keys()
    changed = [n for n, p in frozen.items() if not torch.equal(p, base_parameters[n])]
    assert changed == []


@pytest.mark.parametrize("family", FAMILIES)
def test_the_merged_model_gives_the_adapted_models_logits(family, lora_runs):
    entry = lora_runs[family]
    run = entry["run"]
    adapted, tokenizer = _adapted(entry["base"], run / "adapter")
    merged, _ = _load(run / "model")  # a plain model folder: AutoModelForSeq2SeqLM loads it
    assert type(merged).__name__.endswith("ForConditionalGeneration")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    batch = _teacher_forced_batch(tokenizer, read_pairs(8, split="test"))
    adapted_logits = _logits(adapted, batch)
    tolerance = _merge_tolerance(merged, adapted_logits)
    torch.testing.assert_close(_logits(merged, batch), adapted_logits, atol=tolerance, rtol=0)
    with adapted.disable_adapter():  # the comparison is not between two copies of the base
        assert (_logits(adapted, batch) - adapted_logits).abs().max() > 1e-3
    lora = json.loads((run / "metrics.json").read_text())["lora"]
    # measured by the trainer on its own batch of the same model: logits of the same scale
    assert lora["merged"] is True and 0 <= lora["merge_max_abs_logit_difference"] < tolerance
    # The merged model keeps the base model's generation settings, not the evaluation's.
    assert (merged.generation_config.num_beams, merged.generation_config.max_new_tokens) == (2, 24)


def test_the_merged_transformer_exports_in_every_format(lora_runs, tmp_path):
    from attention_seq2seq.hub.export import export_model
    from attention_seq2seq.hub.export_ct2 import export_ct2
    from attention_seq2seq.hub.export_native import export_native

    run = lora_runs["transformer_seq2seq"]["run"]
    merged, tokenizer = _load(run / "model")
    remote = export_model(run, tmp_path / "remote", base_model="someone/tiny-transformer")
    assert json.loads((remote / "config.json").read_text())["auto_map"]
    assert (remote / "model.safetensors").is_file() and "someone/tiny-transformer" in (remote / "README.md").read_text()
    native = export_native(run, tmp_path / "native")
    native_model, _ = _load(native)
    batch = _teacher_forced_batch(tokenizer, read_pairs(4, split="test"))
    expected = _logits(merged, batch)  # transformers' Marian layers: the same sums in another order
    tolerance = _merge_tolerance(merged, expected)
    torch.testing.assert_close(_logits(native_model, batch), expected, atol=tolerance, rtol=0)
    ct2 = export_ct2(run, tmp_path / "ct2", quantization="float32")
    assert (ct2 / "model.bin").is_file()


def test_the_merged_rnn_exports_as_remote_code(lora_runs, tmp_path):
    from attention_seq2seq.hub.export import export_model

    remote = export_model(lora_runs["rnn_seq2seq"]["run"], tmp_path / "remote")
    assert json.loads((remote / "config.json").read_text())["auto_map"]


# ------------------------------------------------------------------------------------------------
# Without --merge: the adapter alone, merged later


def test_a_run_without_merge_writes_the_adapter_and_merges_later(runs_root, data, tmp_path, capsys):
    base = build_tiny_run("rnn_seq2seq", runs_root)
    run = tmp_path / "adapter-only"
    argv = _argv(base, run, data, max_steps=3, eval_steps=0, validation_file="", test_file="", learning_rate=0.05)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "trainable params: " in out and " || all params: " in out  # peft's own count, at the start
    assert f"attention-seq2seq finetune --merge-adapter {run}" in out
    assert (run / "adapter" / "adapter_config.json").is_file() and not (run / "model").exists()
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["lora"]["merged"] is False
    assert metrics["lora"]["merge_command"] == f"attention-seq2seq finetune --merge-adapter {run}"
    assert f"attention-seq2seq finetune --merge-adapter {run}" in (run / "README.md").read_text()
    from attention_seq2seq.hub.export import ExportError, export_model

    with pytest.raises(ExportError, match="is a LoRA run without a merged model: merge it first with `attention-seq2"):
        export_model(run, tmp_path / "export")

    assert main(["finetune", "--merge-adapter", str(run)]) == 0
    assert export_model(run, tmp_path / "export") == tmp_path / "export"
    adapted, tokenizer = _adapted(base, run / "adapter")
    merged, _ = _load(run / "model")
    batch = _teacher_forced_batch(tokenizer, read_pairs(4, split="test"))
    adapted_logits = _logits(adapted, batch)
    tolerance = _merge_tolerance(merged, adapted_logits)
    torch.testing.assert_close(_logits(merged, batch), adapted_logits, atol=tolerance, rtol=0)
    lora = json.loads((run / "metrics.json").read_text())["lora"]
    assert lora["merged"] is True and lora["merge_max_abs_logit_difference"] < tolerance
    assert "merge_command" not in lora

    weights = (run / "model" / "model.safetensors").read_bytes()
    with pytest.raises(SystemExit) as exit_:
        main(["finetune", "--merge-adapter", str(run)])
    assert exit_.value.code == 2
    assert "model exists already" in capsys.readouterr().err
    assert (run / "model" / "model.safetensors").read_bytes() == weights


# ------------------------------------------------------------------------------------------------
# Checkpoints resume; finished runs are never overwritten


def test_a_lora_run_resumes_from_its_checkpoint_to_the_same_adapter(runs_root, data, tmp_path, capsys):
    from safetensors.torch import load_file

    base = build_tiny_run("rnn_seq2seq", runs_root)
    options = dict(max_steps=4, save_steps=2, save_total_limit=0, eval_steps=0, validation_file="", test_file="")
    straight = tmp_path / "straight"
    assert main(_argv(base, straight, data, **options)) == 0
    # An interrupted copy: the checkpoint of step 2 alone.
    interrupted = tmp_path / "interrupted"
    shutil.copytree(straight / "checkpoints" / "checkpoint-2", interrupted / "checkpoints" / "checkpoint-2")
    with pytest.raises(SystemExit):  # its checkpoint is not overwritten without --resume
        main(_argv(base, interrupted, data, **options))
    assert "already holds checkpoints/: pass --resume" in capsys.readouterr().err
    assert main(_argv(base, interrupted, data, resume=True, **options)) == 0
    state = json.loads((interrupted / "checkpoints" / "checkpoint-4" / "trainer_state.json").read_text())
    assert [e["step"] for e in state["log_history"] if "loss" in e] == [1, 2, 3, 4]  # 1-2 restored, 3-4 trained
    expected = load_file(straight / "adapter" / "adapter_model.safetensors")
    got = load_file(interrupted / "adapter" / "adapter_model.safetensors")
    assert expected.keys() == got.keys() and expected
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=1e-6, rtol=0, msg=name)
    resumed = json.loads((interrupted / "metrics.json").read_text())["train"]["loss_history"]
    straight_losses = json.loads((straight / "metrics.json").read_text())["train"]["loss_history"]
    assert [e["loss"] for e in resumed] == pytest.approx([e["loss"] for e in straight_losses], abs=1e-6)


def test_a_finished_run_is_not_overwritten(lora_runs, data, capsys):
    entry = lora_runs["rnn_seq2seq"]
    before = {path: path.read_bytes() for path in entry["run"].rglob("*") if path.is_file()}
    with pytest.raises(SystemExit) as exit_:
        main(_argv(entry["base"], entry["run"], data, merge=True))
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attention-seq2seq finetune: error: output_dir ") and "\n" not in err
    assert "already holds model, adapter, metrics.json, checkpoints/: pass --resume" in err
    assert {path: path.read_bytes() for path in entry["run"].rglob("*") if path.is_file()} == before


# ------------------------------------------------------------------------------------------------
# One-line errors


def _error_line(argv, capsys) -> str:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line or "Traceback" in line]
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


def test_lora_without_peft_names_the_extra(runs_root, data, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft raises ImportError
    base = build_tiny_run("rnn_seq2seq", runs_root)
    err = _error_line(_argv(base, tmp_path / "x", data), capsys)
    assert "lora: peft is not installed; pip install 'attention-seq2seq[lora]'" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(lora_r=0), "lora_r must be a positive integer (the adapters' rank, e.g. 8); got 0"),
        (dict(lora_alpha=0), "lora_alpha must be > 0"),
        (dict(lora_dropout=1.0), "lora_dropout must be in [0, 1); got 1.0"),
        (dict(lora_target_modules="nope_proj"), "lora_target_modules: 'nope_proj' matches no module; valid: "),
    ],
)
def test_bad_lora_options_fail_in_one_line(options, message, runs_root, data, tmp_path, capsys):
    base = build_tiny_run("transformer_seq2seq", runs_root)
    err = _error_line(_argv(base, tmp_path / "x", data, **options), capsys)
    assert message in err
    assert not (tmp_path / "x" / "metrics.json").exists()


def test_lora_options_without_lora_are_refused(runs_root, data, tmp_path, capsys):
    base = build_tiny_run("rnn_seq2seq", runs_root)
    argv = [word for word in _argv(base, tmp_path / "x", data, lora_r=4, merge=True) if word != "--lora"]
    err = _error_line(argv, capsys)
    assert "lora_r, lora_dropout, merge apply to LoRA runs only: add --lora (recipe: lora: true)" in err


# ------------------------------------------------------------------------------------------------
# The Trainer around a peft model


def test_lora_evaluation_decodes_with_the_configured_settings(runs_root, data, tmp_path):
    """The Trainer sets the evaluation's generation settings on the peft wrapper; generate runs on
    the base model, which must get them too (else it decodes with the base's own 24 tokens)."""
    config = FinetuneConfig(
        base_model=str(build_tiny_run("transformer_seq2seq", runs_root)),
        output_dir=str(tmp_path),
        train_file=str(data["train"]),
        validation_file=str(data["validation"]),
        generation_max_new_tokens=37,
        generation_num_beams=1,
        lora=True,
    )
    model, tokenizer = ft.load_model_and_tokenizer(config)
    adapted = lora.apply_lora(model, config)
    raw, _ = ft.load_pairs(config)
    tokenized = {split: ft.tokenize_pairs(dataset, tokenizer, config) for split, dataset in raw.items()}
    trainer = ft.build_trainer(config, adapted, tokenizer, tokenized)
    trainer.model.generation_config.suppress_tokens = [tokenizer.eos_token_id]  # only the limit stops decoding
    prediction = trainer.predict(tokenized["validation"])
    longest = (~np.isin(prediction.predictions, [-100, tokenizer.pad_token_id])).sum(axis=1).max()
    assert longest == 37 + 1


def test_lora_with_gradient_checkpointing_gives_the_same_training(runs_root, data, tmp_path):
    """Transformer: checkpointed LoRA training computes the plain run's losses and adapters (the
    checkpointed blocks pass gradients on to the adapters inside them)."""
    import transformers

    base = str(build_tiny_run("transformer_seq2seq", runs_root))
    results = {}
    for checkpointing in (False, True):
        config = FinetuneConfig(
            base_model=base,
            output_dir=str(tmp_path / str(checkpointing)),
            train_file=str(data["train"]),
            max_steps=3,
            per_device_train_batch_size=16,
            learning_rate=0.05,
            logging_steps=1,
            lora=True,
            lora_dropout=0.0,
            gradient_checkpointing=checkpointing,
        )
        transformers.set_seed(config.seed)
        model, tokenizer = ft.load_model_and_tokenizer(config)
        adapted = lora.apply_lora(model, config)
        raw, _ = ft.load_pairs(config)
        tokenized = {split: ft.tokenize_pairs(dataset, tokenizer, config) for split, dataset in raw.items()}
        trainer = ft.build_trainer(config, adapted, tokenizer, tokenized)
        trainer.train()
        assert trainer.model.get_base_model().is_activation_checkpointing is checkpointing
        losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
        adapters = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if ".lora_" in n}
        results[checkpointing] = losses, adapters
    assert len(results[True][0]) == 3
    assert results[True][0] == pytest.approx(results[False][0], abs=1e-5)
    plain, checkpointed = results[False][1], results[True][1]
    assert plain.keys() == checkpointed.keys() and plain
    for name, value in plain.items():
        assert (value != 0).any() or ".lora_A." in name  # every B moved off zero: gradients reached it
        torch.testing.assert_close(checkpointed[name], value, atol=1e-5, rtol=1e-4, msg=name)
