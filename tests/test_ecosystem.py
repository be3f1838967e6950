"""The routes a transformers user takes with any seq2seq model, tried on both families and every
Transformer layout beside a `MarianMTModel` of the same size: loading in half precision, LoRA
adapters (peft), dynamic int8 quantization, the static cache, gradient checkpointing, attention
backends, and a Hub user's load + generate measuring and writing nothing.

Each route either works as it does for Marian or, where it cannot exist for a family (an RNN
has no key/value cache to make static), is refused with one clear line. A change that breaks a
route fails here.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import TRANSFORMER_LAYOUTS, layout_transformer, tiny_model
from torch import nn
from transformers import AutoModelForSeq2SeqLM, MarianConfig, MarianMTModel

PAD, BOS, EOS = 0, 1, 2
VOCAB = 40

RNN_VARIANTS = {
    "none-gru": dict(attention="none"),
    "bahdanau-lstm-coverage": dict(attention="bahdanau", cell_type="lstm", coverage=True),
    "luong-general-feed-gru": dict(attention="luong", score="general"),
    "luong-concat-local-p-lstm": dict(
        attention="luong", score="concat", window="local-p", window_size=2, cell_type="lstm"
    ),
    "luong-dot-local-m-hard": dict(
        attention="luong", score="dot", window="local-m", window_size=2, attention_mode="hard"
    ),
}
MODELS = ["marian"] + [f"transformer:{name}" for name in TRANSFORMER_LAYOUTS] + [f"rnn:{name}" for name in RNN_VARIANTS]
TRANSFORMERS = ["marian"] + [f"transformer:{name}" for name in TRANSFORMER_LAYOUTS]
RNNS = [f"rnn:{name}" for name in RNN_VARIANTS]


def build(name: str, seed: int = 0) -> nn.Module:
    """A small model in eval mode, dropout 0: "marian", "transformer:<layout>" or "rnn:<variant>"."""
    family, _, variant = name.partition(":")
    torch.manual_seed(seed)
    if family == "marian":
        config = MarianConfig(
            vocab_size=VOCAB,
            d_model=16,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            max_position_embeddings=64,
            dropout=0.0,
            pad_token_id=PAD,
            eos_token_id=EOS,
            decoder_start_token_id=BOS,
            forced_eos_token_id=None,
            init_std=0.3,
        )
        model = MarianMTModel(config)
    elif family == "transformer":
        model = layout_transformer(VOCAB, variant, seed=seed)
    else:
        model = tiny_model(
            "rnn_seq2seq",
            VOCAB,
            seed=seed,
            hidden_size=16,
            embedding_size=12,
            encoder_layers=2,
            decoder_layers=2,
            dropout=0.0,
            init_range=1.0,
            **RNN_VARIANTS[variant],
        )
    return model.eval()


def sources() -> tuple[torch.Tensor, torch.Tensor]:
    """Three right-padded sources of lengths 6, 3 and 5, each ending in </s>."""
    rows = [[5, 6, 7, 8, 9, EOS], [10, 11, EOS], [12, 13, 14, 15, EOS]]
    width = max(map(len, rows))
    input_ids = torch.tensor([row + [PAD] * (width - len(row)) for row in rows])
    return input_ids, (input_ids != PAD).long()


def labels() -> torch.Tensor:
    return torch.tensor([[16, 17, 18, 19, EOS], [20, 21, EOS, -100, -100], [22, 23, 24, EOS, -100]])


def generate(model: nn.Module, **kwargs) -> torch.Tensor:
    input_ids, attention_mask = sources()
    settings = dict(max_new_tokens=8, num_beams=1, do_sample=False, pad_token_id=PAD, eos_token_id=EOS)
    settings.update(kwargs)
    with torch.no_grad():
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, **settings)


def teacher_forced_logits(model: nn.Module) -> torch.Tensor:
    input_ids, attention_mask = sources()
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask, labels=labels()).logits.float()


# ---------------------------------------------------------------------------------------------
# dtype: from_pretrained(dtype=...), .to(dtype), .half(), .bfloat16()
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", MODELS)
def test_loads_in_half_precision_and_generates_like_float32(name, dtype, tmp_path):
    model = build(name)
    model.save_pretrained(tmp_path)
    full = teacher_forced_logits(model)
    for half in (
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path, dtype=dtype).eval(),
        copy.deepcopy(model).to(dtype),
        copy.deepcopy(model).half() if dtype == torch.float16 else copy.deepcopy(model).bfloat16(),
    ):
        assert {p.dtype for p in half.parameters()} == {dtype}
        assert all(b.dtype == dtype for b in half.buffers() if b.is_floating_point())
        logits = teacher_forced_logits(half)
        if getattr(model.config, "attention_mode", "soft") != "hard":  # an argmax may flip under rounding
            # Half precision keeps ~3 significant digits; through a few layers the logits stay close.
            torch.testing.assert_close(logits, full, rtol=0.05, atol=0.05 * float(full.abs().max()))
        tokens = generate(half)
        assert tokens.dtype == torch.long and tokens.size(1) > 1
        assert ((tokens >= 0) & (tokens < VOCAB)).all()


_REMOTE_IN_HALF = textwrap.dedent(
    """
    import sys, torch
    sys.modules["attention_seq2seq"] = None  # the shipped code alone, as a Hub user has it
    from transformers import AutoModelForSeq2SeqLM
    model = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1], trust_remote_code=True, dtype=torch.bfloat16).eval()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert all(b.dtype == torch.bfloat16 for b in model.buffers() if b.is_floating_point())
    ids = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]])
    with torch.no_grad():
        for beams in (1, 3):
            out = model.generate(input_ids=ids, attention_mask=(ids != 0).long(), num_beams=beams, max_new_tokens=5)
    print(type(model).__module__, out.shape[0])
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["transformer:post-sinusoidal", "transformer:pre-learned", "rnn:bahdanau-lstm-coverage"]
)
def test_remote_code_export_loads_in_bfloat16_where_the_package_is_absent(name, tmp_path):
    from attention_seq2seq.hub.export import write_remote_code

    model = build(name)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    write_remote_code(model, folder)
    script = tmp_path / "load.py"
    script.write_text(_REMOTE_IN_HALF)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, str(script), str(folder)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    module, rows = result.stdout.split()[-2:]
    assert module.startswith("transformers_modules") and int(rows) == 2


# ---------------------------------------------------------------------------------------------
# PEFT: LoRA adapters are used in forward and generate, and every one gets a gradient
# ---------------------------------------------------------------------------------------------


def lora_targets(model: nn.Module) -> list[str]:
    """The attention projections (Marian's and the Transformer's q/k/v_proj); for an RNN every
    Linear layer but the (tied) lm_head."""
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"]
    if any(n.endswith("q_proj") for n in names) and not isinstance(getattr(model.config, "cell_type", None), str):
        return [n for n in names if n.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj")]
    return names


@pytest.mark.parametrize("name", MODELS)
def test_lora_adapters_all_get_a_gradient_and_change_generate(name):
    peft = pytest.importorskip("peft")
    model = build(name)
    targets = lora_targets(model)
    assert targets
    config = peft.LoraConfig(
        r=2, lora_alpha=4, lora_dropout=0.0, target_modules="^(" + "|".join(map(re.escape, targets)) + ")$"
    )
    adapted = peft.get_peft_model(model, config)
    lora_a = {n: p for n, p in adapted.named_parameters() if "lora_A" in n}
    lora_b = {n: p for n, p in adapted.named_parameters() if "lora_B" in n}
    assert len(lora_a) == len(lora_b) == len(targets)
    # lora_B starts at zero (the adapter adds nothing yet): give it values, so lora_A gets a gradient too.
    with torch.no_grad():
        for p in lora_b.values():
            p.normal_(0.0, 0.5)
    adapted.train()
    input_ids, attention_mask = sources()
    adapted(input_ids=input_ids, attention_mask=attention_mask, labels=labels()).loss.backward()
    without_gradient = [n for n, p in {**lora_a, **lora_b}.items() if p.grad is None or not p.grad.abs().sum() > 0]
    assert without_gradient == [], f"adapters that the forward never used: {without_gradient}"
    # generate() goes through the same modules: its scores move with the adapter.
    adapted.eval()
    scores = torch.stack(generate(adapted, return_dict_in_generate=True, output_scores=True, min_new_tokens=8).scores)
    with adapted.disable_adapter():
        base = torch.stack(generate(adapted, return_dict_in_generate=True, output_scores=True, min_new_tokens=8).scores)
    assert not torch.allclose(scores, base)


@pytest.mark.parametrize("name", ["marian", "transformer:pre-sinusoidal", "rnn:luong-general-feed-gru"])
def test_lora_with_peft_seq2seq_task_type_trains_and_generates(name):
    """peft's usual seq2seq route, `LoraConfig(task_type="SEQ_2_SEQ_LM")`, wraps the model in
    `PeftModelForSeq2SeqLM`, which passes inputs_embeds=None / decoder_inputs_embeds=None to forward."""
    peft = pytest.importorskip("peft")
    model = build(name)
    targets = sorted({n.rsplit(".", 1)[-1] for n in lora_targets(model)})
    config = peft.LoraConfig(task_type="SEQ_2_SEQ_LM", r=2, lora_alpha=4, lora_dropout=0.0, target_modules=targets)
    adapted = peft.get_peft_model(model, config)
    assert type(adapted).__name__ == "PeftModelForSeq2SeqLM"
    adapted.train()
    input_ids, attention_mask = sources()
    loss = adapted(input_ids=input_ids, attention_mask=attention_mask, labels=labels()).loss
    loss.backward()
    assert all(p.grad is not None for n, p in adapted.named_parameters() if "lora_B" in n)
    adapted.eval()
    with torch.no_grad():
        tokens = adapted.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=5, num_beams=2)
    assert tokens.size(0) == 3
    if name != "marian":
        with pytest.raises(ValueError, match="inputs_embeds"):
            model(inputs_embeds=torch.zeros(3, 6, 16), labels=labels())


# ---------------------------------------------------------------------------------------------
# Dynamic int8 quantization (torch.ao.quantization.quantize_dynamic replaces the modules)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_dynamic_int8_quantization_generates_close_to_float32(name):
    model = build(name)
    layers = {nn.Linear, nn.LSTM, nn.GRU} if name.startswith("rnn") else {nn.Linear}
    quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), layers, dtype=torch.qint8)
    replaced = [n for n, m in quantized.named_modules() if "quantized" in type(m).__module__]
    assert replaced, "quantize_dynamic replaced no module"
    full, low = teacher_forced_logits(model), teacher_forced_logits(quantized)
    # int8 weights with float activations: the logits follow the float ones closely.
    assert torch.corrcoef(torch.stack([full.flatten(), low.flatten()]))[0, 1] > 0.98
    tokens = generate(quantized)
    assert ((tokens >= 0) & (tokens < VOCAB)).all() and tokens.size(1) > 1
    beam = generate(quantized, num_beams=3)
    assert beam.size(0) == 3


# ---------------------------------------------------------------------------------------------
# The static cache (and compile): a Transformer's key/value cache; the RNN refuses
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("name", TRANSFORMERS)
def test_static_cache_gives_the_dynamic_cache_tokens(name, num_beams):
    model = build(name)
    dynamic = generate(model, num_beams=num_beams, min_new_tokens=8)
    static = generate(model, num_beams=num_beams, min_new_tokens=8, cache_implementation="static")
    assert torch.equal(static, dynamic)


@pytest.mark.parametrize("name", RNNS[:2])
def test_rnn_refuses_the_static_cache_in_one_line(name):
    model = build(name)
    with pytest.raises(ValueError, match="static") as error:
        generate(model, cache_implementation="static")
    assert "\n" not in str(error.value).strip()


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_transformers_can_compile_fullgraph(name):
    model = build(name)
    assert type(model)._can_compile_fullgraph


@pytest.mark.slow
@pytest.mark.parametrize("num_beams", [1, 3])
def test_compiled_static_cache_decoding_gives_the_eager_tokens(num_beams):
    """generate() compiles the decoding step (fullgraph, inductor) with the static cache; on a CPU only
    when the CompileConfig says so (`_compile_all_devices`). Same tokens as eager decoding, twice (the
    second call reuses the compiled step)."""
    from transformers import CompileConfig

    model = build("transformer:pre-sinusoidal")
    eager = generate(model, num_beams=num_beams, min_new_tokens=8)
    config = CompileConfig(fullgraph=True, dynamic=False, mode="default")
    config._compile_all_devices = True  # a class attribute of CompileConfig, not an init field
    torch._dynamo.reset()
    for _ in range(2):
        compiled = generate(
            model, num_beams=num_beams, min_new_tokens=8, cache_implementation="static", compile_config=config
        )
        assert torch.equal(compiled, eager)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # something was compiled


# ---------------------------------------------------------------------------------------------
# Gradient checkpointing: the same gradients as the plain backward
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_gradient_checkpointing_gives_the_plain_gradients(name):
    plain, checkpointed = build(name).train(), build(name).train()
    checkpointed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert checkpointed.is_gradient_checkpointing
    input_ids, attention_mask = sources()
    for model in (plain, checkpointed):
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels()).loss.backward()
    for (n, p), q in zip(plain.named_parameters(), checkpointed.parameters()):
        assert (p.grad is None) == (q.grad is None), n
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=n)


# ---------------------------------------------------------------------------------------------
# Attention backends
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_flex_attention_gives_the_eager_logits(name, tmp_path):
    model = build(name)
    assert type(model)._supports_flex_attn
    model.save_pretrained(tmp_path)
    eager = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    flex = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, attn_implementation="flex_attention").eval()
    assert flex.config._attn_implementation == "flex_attention"
    input_ids, attention_mask = sources()
    real = labels() != -100  # logits at padded target positions are not compared
    torch.testing.assert_close(
        teacher_forced_logits(flex)[real], teacher_forced_logits(eager)[real], rtol=1e-5, atol=1e-5
    )
    if name != "marian":  # Marian's own flex decoding drifts from its eager decoding on the CPU (a step of 8)
        assert torch.equal(generate(flex), generate(eager))


# ---------------------------------------------------------------------------------------------
# A Hub user's load + generate measures nothing and writes nothing
# ---------------------------------------------------------------------------------------------

SHIPPED = sorted(
    p
    for folder in ("modeling", "configuration")
    for p in (Path(__file__).resolve().parents[1] / folder).glob("*.py")
    if p.name not in ("__init__.py", "registry.py")
)
# What shipped model code must not do: time kernels, write files, read a cache folder, call private
# oneDNN ops, or drive GenerationMixin's private loop.
FORBIDDEN = {
    "a clock": r"\bperf_counter\b|\btime\.time\(|\bmonotonic\(",
    "a file write": r"json\.dump|write_text|write_bytes|open\([^)]*[\"'][wa]b?[\"']",
    "a cache folder": r"cache_root|XDG_CACHE_HOME|expanduser|Path\.home",
    "a private oneDNN op": r"torch\.ops\.mkldnn",
    "GenerationMixin's private loop": r"_prefill|_update_model_kwargs_for_generation|_optimize_model_for_decode",
}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_model_files_neither_time_nor_write(path):
    text = path.read_text(encoding="utf-8")
    found = {what: re.findall(pattern, text) for what, pattern in FORBIDDEN.items()}
    assert not any(found.values()), f"{path.name}: { ({k: v for k, v in found.items() if v}) }"


_NO_WRITES = textwrap.dedent(
    """
    import os, sys
    allowed = tuple(sys.argv[3:])
    if sys.argv[2] == "remote":
        sys.modules["attention_seq2seq"] = None  # the shipped code alone, as a Hub user has it
    else:
        import attention_seq2seq  # registers the Auto classes

    def refuse_writes(event, args):
        if event == "open" and args[1] is not None and (
            (isinstance(args[1], str) and any(c in args[1] for c in "wax+")) or
            (isinstance(args[1], int) and args[1] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
        ):
            path = str(args[0])
            if not path.startswith(allowed) and path != "/dev/null":
                raise PermissionError(f"wrote {path}")
        if event in ("os.mkdir", "os.rename", "os.remove", "shutil.rmtree") and not str(args[0]).startswith(allowed):
            raise PermissionError(f"{event} {args[0]}")

    # torch's and transformers' own start-up (torch._dynamo makes its cache folder on import) comes
    # before the hook: it is not under test
    import torch, transformers, transformers.modeling_utils, transformers.generation.utils
    from transformers import AutoModelForSeq2SeqLM
    sys.addaudithook(refuse_writes)
    model = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1], trust_remote_code=sys.argv[2] == "remote").eval()
    ids = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]])
    with torch.no_grad():
        for beams in (1, 3):
            out = model.generate(input_ids=ids, attention_mask=(ids != 0).long(), num_beams=beams, max_new_tokens=5)
    print(out.tolist())
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["transformer_seq2seq", "rnn_seq2seq"])
@pytest.mark.parametrize("how", ["native", "remote"])
def test_load_and_generate_with_a_read_only_home_writes_and_measures_nothing(family, how, tmp_path):
    """`from_pretrained` + greedy and beam `generate`, in a fresh process whose HOME and cache
    folders cannot be written (they lie under a regular file), with an audit hook that fails any
    file write or new folder outside the remote-code module cache."""
    model = tiny_model(family, VOCAB, seed=0)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    if how == "remote":
        from attention_seq2seq.hub.export import write_remote_code

        write_remote_code(model, folder)  # the flattened code and auto_map the export ships
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    modules = tmp_path / "hf_modules"
    env = {
        **os.environ,
        "HOME": str(blocked / "home"),
        "XDG_CACHE_HOME": str(blocked / "cache"),
        "ATTENTION_SEQ2SEQ_CACHE": str(blocked / "attention_seq2seq"),
        "HF_HOME": str(blocked / "hf"),
        "HF_MODULES_CACHE": str(modules),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    script = tmp_path / "load.py"
    script.write_text(_NO_WRITES)
    allowed = [str(modules), "/proc/", "/dev/"]
    result = subprocess.run(
        [sys.executable, str(script), str(folder), how, *allowed], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])
