"""LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") through peft.

Each adapted ``nn.Linear`` W (out x in) gains ``lora_B @ lora_A`` (out x r and r x in, ``lora_B``
zero at the start, so training starts from the base model), scaled by ``lora_alpha / lora_r``;
every base weight stays frozen. ``merge_lora`` folds the adapters back into plain weights.

The functions take a model and settings, not a trainer: the fine-tuning run
(training/finetune_trainer.py) uses them, and training/train.py can wrap its model the same way.
peft is an optional dependency (``pip install 'attention-seq2seq[lora]'``), imported only when a
run asks for LoRA.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

LORA_INSTALL = "pip install 'attention-seq2seq[lora]'"
# The Transformer's attention projections (Marian's and BART's names too): self- and cross-attention.
TRANSFORMER_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj")
# The RNN layers that turn the attention's context into the vector the lm_head reads.
RNN_LORA_OUTPUT_LAYERS = ("deep_output", "attn_combine")
# A --lora-target-modules value with one of these is a regex; otherwise a comma list of suffixes.
_REGEX_CHARACTERS = frozenset("^$*+?()[]{}|\\")


class LoraSettingError(ValueError):
    """A LoRA setting that does not fit the loaded model (found only once it is loaded)."""


def require_peft():
    """The ``peft`` module.

    Raises:
        ImportError: one line naming the install command, where peft is missing.
    """
    try:
        import peft
    except ImportError:
        raise ImportError(f"lora: peft is not installed; {LORA_INSTALL} (or: pip install peft)") from None
    return peft


def default_lora_targets(model) -> list[str]:
    """Full names of the modules LoRA adapts when ``lora_target_modules`` is empty.

    RNN (``model_type == "rnn_seq2seq"``): every ``nn.Linear`` of the decoder's attention (whichever
    of q_proj, k_proj, coverage_proj, w_p, v_p, key_strength the variant has) and the output layer
    between the attention and the lm_head (Bahdanau's ``deep_output``, Luong's ``attn_combine``).
    Any other model: the attention projections ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` of
    every layer (the Transformer's self- and cross-attention). Never the lm_head or the embeddings
    (tied in the Transformer; a merge would change both), nor the RNN cells (peft has no LoRA
    for ``nn.GRU`` / ``nn.LSTM``). The list may be empty (an RNN without attention whose output
    layer is the lm_head alone); `resolve_lora_targets` then asks for explicit targets.
    """
    names = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if getattr(model.config, "model_type", None) == "rnn_seq2seq":
        return [
            name for name in names if ".attention." in f".{name}." or name.rsplit(".", 1)[-1] in RNN_LORA_OUTPUT_LAYERS
        ]
    return [name for name in names if name.rsplit(".", 1)[-1] in TRANSFORMER_LORA_TARGETS]


def resolve_lora_targets(model, spec: str) -> list[str]:
    """Full module names (in ``named_modules`` order) that ``spec`` selects in ``model``.

    ``spec`` is ``lora_target_modules``: "" for `default_lora_targets`; a regex (it holds one of
    ``^$*+?()[]{}|`` or a backslash) that must match a module's whole name, as peft reads a
    string; or a comma list of suffixes, each matching a module named exactly so or ending in
    ``.<suffix>`` (``q_proj``, ``attention.k_proj``), as peft reads a list.

    Raises:
        LoraSettingError: (a ValueError) one line naming ``lora_target_modules``: the regex does
            not compile, a pattern matches no module, or a match is not an ``nn.Linear`` /
            ``nn.Embedding`` or shares its weight with another module (a tied lm_head or
            embedding: merging would change both).
    """
    modules = dict(model.named_modules())
    family = getattr(model.config, "model_type", type(model).__name__)
    linear_suffixes = sorted({name.rsplit(".", 1)[-1] for name, m in modules.items() if isinstance(m, nn.Linear)})
    valid = (
        "valid: a comma list of module-name suffixes or a regex over full names; "
        f"this {family} model's Linear layers end in {', '.join(linear_suffixes)}"
    )
    spec = spec.strip()
    if not spec:
        targets = default_lora_targets(model)
        if not targets:
            raise LoraSettingError(f"lora_target_modules: this {family} model has no default LoRA targets; {valid}")
    elif _REGEX_CHARACTERS & set(spec):
        try:
            pattern = re.compile(spec)
        except re.error as err:
            raise LoraSettingError(f"lora_target_modules: {spec!r} is not a valid regex ({err}); {valid}") from None
        targets = [name for name in modules if name and pattern.fullmatch(name)]
        if not targets:
            raise LoraSettingError(f"lora_target_modules: the regex {spec!r} matches no module name; {valid}")
    else:
        targets = []
        for suffix in (part.strip() for part in spec.split(",")):
            matched = [name for name in modules if name and (name == suffix or name.endswith("." + suffix))]
            if not suffix or not matched:
                raise LoraSettingError(f"lora_target_modules: {suffix!r} matches no module; {valid}")
            targets += matched
        targets = [name for name in modules if name in set(targets)]

    owners: dict[int, list[str]] = {}
    for name, module in modules.items():
        for param_name, param in module.named_parameters(prefix=name, recurse=False):
            owners.setdefault(id(param), []).append(param_name)
    for name in targets:
        module = modules[name]
        if not isinstance(module, (nn.Linear, nn.Embedding)):
            raise LoraSettingError(
                f"lora_target_modules: {name} is a {type(module).__name__}; LoRA here adapts Linear "
                f"(and untied Embedding) layers; {valid}"
            )
        sharing = [other for other in owners.get(id(module.weight), []) if not other.startswith(name + ".")]
        if sharing:
            raise LoraSettingError(
                f"lora_target_modules: {name} shares its weight with {sharing[0]} (tied embeddings): a merge "
                f"would change both; leave it out ({valid})"
            )
    return targets


def apply_lora(model, config):
    """``model`` wrapped by peft's LoRA on `resolve_lora_targets` of ``config.lora_target_modules``.

    ``config`` is any object with ``lora_r``, ``lora_alpha``, ``lora_dropout`` and
    ``lora_target_modules`` (a ``FinetuneConfig``).

    Every base parameter is frozen; each target gets ``lora_A`` (r x in) and ``lora_B`` (out x r,
    zero at the start, so the wrapped model starts as the base) scaled by ``lora_alpha / lora_r``.
    The result is a plain ``peft.PeftModel`` (no ``task_type``): ``PeftModelForSeq2SeqLM`` passes
    ``inputs_embeds`` and ``decoder_inputs_embeds``, which neither family's forward takes.

    Raises:
        ImportError: peft is missing (`require_peft`).
        LoraSettingError: see `resolve_lora_targets`.
    """
    peft = require_peft()
    targets = resolve_lora_targets(model, config.lora_target_modules)
    lora_config = peft.LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=targets,
        bias="none",
    )
    return peft.get_peft_model(model, lora_config)


def _teacher_forced_logits(model, batch: dict) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(**batch).logits.float()


def merge_lora(peft_model, check_batch: dict | None = None):
    """The adapters merged into the base weights (``merge_and_unload``): ``(plain model, difference)``.

    ``difference`` is the largest absolute difference between the teacher-forced logits of the
    adapted and the merged model on ``check_batch`` (model inputs with ``labels`` or
    ``decoder_input_ids``, on the model's device), or None without a batch. Merging changes the
    base model in place; the returned model is in eval mode.
    """
    before = _teacher_forced_logits(peft_model, check_batch) if check_batch else None
    merged = peft_model.merge_and_unload()
    if before is None:
        return merged.eval(), None
    after = _teacher_forced_logits(merged, check_batch)
    return merged, float((after - before).abs().max())


def merge_command(output_dir: str | Path) -> str:
    return f"attention-seq2seq finetune --merge-adapter {output_dir}"


def write_lora_readme(output_dir: Path, lora: dict) -> None:
    """README.md of a LoRA run's folder: what it holds and how to merge or load the adapter."""
    merged = lora["merged"]
    lines = [
        "# LoRA fine-tuning run",
        "",
        f"LoRA r={lora['r']}, alpha={lora['alpha']}, dropout={lora['dropout']} on {len(lora['target_modules'])} "
        f"modules; {lora['trainable_parameters']:,} trainable of {lora['total_parameters']:,} parameters.",
        "",
        "- `adapter/`: the adapter alone (peft `save_pretrained`), with the tokenizer.",
    ]
    if merged:
        lines += [
            "- `model/`: the adapter merged into the base model (`merge_and_unload`), a plain model:",
            f"  `attention-seq2seq export {output_dir}` exports it like a full fine-tune.",
        ]
    else:
        lines += [
            "- no `model/` yet: merge the adapter into the base model (writes `model/`) with",
            "",
            f"      {merge_command(output_dir)}",
            "",
            "  (the base is read from `recipe.yaml`; `--base-model PATH` overrides it), then export as usual.",
        ]
    lines += [
        "- `metrics.json`, `recipe.yaml`, `checkpoints/`: as for every fine-tuning run.",
        "",
        "Loading the adapter on the base with peft: `PeftModel.from_pretrained(base_model, 'adapter')`.",
        "",
    ]
    (output_dir / "README.md").write_text("\n".join(lines), encoding="utf-8")
