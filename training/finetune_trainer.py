"""Fine-tune a trained or exported model with transformers' ``Seq2SeqTrainer``.

This is the path a Hugging Face user already knows: ``Seq2SeqTrainer`` + ``DataCollatorForSeq2Seq``
with ``predict_with_generate`` and BLEU/chrF from sacrebleu. It starts from any model this package
wrote (a training output folder, an export folder, a plain model folder or a Hub id) and writes a
folder with the same layout as ``training/train.py``, so ``attention-seq2seq export`` turns it into a
Hub repo whose card names the base model.

The file needs only torch, transformers, datasets and sacrebleu. With the package installed the
scores come from its evaluate module (``attention_seq2seq.TRANSLATION_METRIC_PATH``: the same BLEU
and chrF as the package's own trainer and ``evaluate`` command); without it, from plain sacrebleu
calls that give the same numbers. Run next to an
export with ``--trust-remote-code`` it works where this package is not installed at all: the data
then comes from JSONL files (``{"source": ..., "target": ...}`` per line). With the package
installed, ``--corpus`` takes any corpus spec of ``attention_seq2seq.data.load_corpus``.

Examples::

    # the recipe: a Bible es->en model fine-tuned on 2,000 Multi30k de->en pairs
    attention-seq2seq finetune --recipe training/recipes/finetune-bible-multi30k.yaml
    python -m attention_seq2seq.training.finetune_trainer --recipe training/recipes/finetune-bible-multi30k.yaml

    # from an export, with transformers alone
    python finetune_trainer.py --base-model ./export --trust-remote-code \\
        --train-file train.jsonl --validation-file dev.jsonl --output-dir runs/ft --max-steps 500

    # several GPUs: the Trainer runs on Accelerate, any launcher works
    torchrun --nproc_per_node 4 -m attention_seq2seq.training.finetune_trainer --recipe ...
    accelerate launch -m attention_seq2seq.training.finetune_trainer --recipe ...

``per_device_train_batch_size`` is per process; the global batch is that times the number of
processes times ``gradient_accumulation_steps``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)


@dataclass
class FinetuneConfig:
    """Hyperparameters of a fine-tuning run (every field is a command-line option and a recipe key)."""

    # --- where to start and where to write --------------------------------------------------
    base_model: str = ""  # training output folder, export folder, model folder or Hub id
    output_dir: str = ""  # gets model/, metrics.json, recipe.yaml, checkpoints/, logs/
    base_model_id: str = ""  # the base's Hub id for the card's `base_model` (when base_model is a path)
    trust_remote_code: bool = False  # run the code shipped in an export (needed without this package)

    # --- data: a corpus spec (needs this package) or JSONL files with "source"/"target" -----
    corpus: str = ""  # e.g. "multi30k:../shared/data/multi30k" (see attention_seq2seq.data)
    train_file: str = ""
    validation_file: str = ""
    test_file: str = ""
    max_train_samples: int = 0  # 0 = all; a small slice is the point of fine-tuning
    max_eval_samples: int = 500  # validation sentences decoded at each evaluation (0 = all)
    max_test_samples: int = 0  # test sentences scored at the end (0 = all)
    max_source_length: int = 128  # longer inputs are truncated (tokens)
    max_target_length: int = 128

    # --- optimisation (Seq2SeqTrainingArguments) --------------------------------------------
    max_steps: int = 1000
    per_device_train_batch_size: int = 32
    per_device_eval_batch_size: int = 64
    gradient_accumulation_steps: int = 1
    learning_rate: float = 1e-4  # smaller than from scratch: keep what the base model knows
    lr_scheduler_type: str = "linear"  # any transformers SchedulerType: linear, cosine, constant, ...
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    label_smoothing: float = 0.1
    gradient_checkpointing: bool = False  # trade compute for memory (recompute activations)
    bf16: bool = False
    fp16: bool = False
    seed: int = 42

    # --- evaluation and checkpoints ---------------------------------------------------------
    eval_steps: int = 200  # validation BLEU/chrF every N steps (0 = only at the end)
    logging_steps: int = 50
    save_steps: int = 0  # 0 = save at each evaluation
    save_total_limit: int = 2
    # Generation during evaluation is always set explicitly (the library default stops at 20 tokens).
    generation_num_beams: int = 4
    generation_max_new_tokens: int = 128
    report_to: str = "none"  # "tensorboard" writes to <output_dir>/logs
    resume: bool = False  # continue from the newest checkpoint in <output_dir>/checkpoints

    # --- LoRA (peft: pip install 'attention-seq2seq[lora]'); docs/training.md ---------------
    lora: bool = False  # train low-rank adapters on chosen Linear layers; every base weight stays frozen
    lora_r: int = 8  # the adapters' rank (>= 1)
    lora_alpha: int = 16  # adapter outputs are scaled by lora_alpha / lora_r
    lora_dropout: float = 0.05  # dropout on each adapter's input, in [0, 1)
    lora_target_modules: str = ""  # comma list of module-name suffixes or a regex over full names ("": family default)
    merge: bool = False  # with lora: also write model/, the merged plain model (exports like a full fine-tune)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field for settings that cannot work."""
        if not self.base_model:
            raise ValueError("base_model is required (a training folder, an export folder or a Hub id)")
        if not self.output_dir:
            raise ValueError("output_dir is required")
        if not self.corpus and not self.train_file:
            raise ValueError("give either corpus (a corpus spec) or train_file (JSONL with source/target)")
        if self.corpus and self.train_file:
            raise ValueError("give corpus or train_file, not both")
        for name in (
            "max_steps",
            "per_device_train_batch_size",
            "per_device_eval_batch_size",
            "gradient_accumulation_steps",
            "generation_num_beams",
            "generation_max_new_tokens",
            "max_source_length",
            "max_target_length",
            "logging_steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        for name in (
            "max_train_samples",
            "max_eval_samples",
            "max_test_samples",
            "eval_steps",
            "save_steps",
            "warmup_steps",
            "save_total_limit",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0; got {getattr(self, name)}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1); got {self.label_smoothing}")
        if self.bf16 and self.fp16:
            raise ValueError("bf16 and fp16 are exclusive; choose one")
        if self.report_to not in ("none", "tensorboard"):
            raise ValueError(f"report_to must be one of 'none', 'tensorboard'; got {self.report_to!r}")
        if self.lora_r < 1:
            raise ValueError(f"lora_r must be a positive integer (the adapters' rank, e.g. 8); got {self.lora_r}")
        if self.lora_alpha <= 0:
            raise ValueError(f"lora_alpha must be > 0 (adapter outputs are scaled by alpha / r); got {self.lora_alpha}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout must be in [0, 1); got {self.lora_dropout}")
        if not self.lora:
            defaults = {f.name: f.default for f in fields(self)}
            changed = [
                name
                for name in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "merge")
                if getattr(self, name) != defaults[name]
            ]
            if changed:
                raise ValueError(f"{', '.join(changed)} apply to LoRA runs only: add --lora (recipe: lora: true)")


# --------------------------------------------------------------------------------------------
# Metrics


def build_compute_metrics(tokenizer, *, bleu_tokenize: str | None = None) -> Callable[[Any], dict]:
    """A ``compute_metrics`` for ``Seq2SeqTrainer(predict_with_generate=True)``: BLEU and chrF.

    Predictions and labels arrive as padded integer arrays. The Trainer pads predictions of
    different batches to one width with -100, and labels carry -100 wherever the loss ignores a
    position; -100 is not a token id, so both are replaced by the pad id before decoding, and
    decoding drops special tokens, giving the plain detokenized text sacrebleu expects.
    ``bleu_tokenize`` is sacrebleu's tokenizer ("13a" by default; "zh" for Chinese targets).

    With the package installed the scores come from ``evaluate.load`` of its translation metric
    (`attention_seq2seq.translation.scores.load_translation_metric`, in memory: no cache file per process); without
    it, from `score_corpus`.
    """
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    special_ids = np.array(sorted(set(tokenizer.all_special_ids) | {-100}))
    try:
        from attention_seq2seq.translation.scores import load_translation_metric
    except ImportError:  # run next to an export, with transformers alone
        metric = None
    else:
        metric = load_translation_metric(keep_in_memory=True)

    def compute_metrics(eval_pred) -> dict:
        predictions, labels = eval_pred.predictions, eval_pred.label_ids
        if isinstance(predictions, tuple):  # (generated ids, ...) from some models
            predictions = predictions[0]
        hypotheses = decode_ids(tokenizer, predictions, pad_id)
        references = decode_ids(tokenizer, labels, pad_id)
        if metric is None:
            scores = score_corpus(hypotheses, references, bleu_tokenize=bleu_tokenize)
        else:
            scores = metric.compute(predictions=hypotheses, references=references, tokenize=bleu_tokenize)
        lengths = (~np.isin(np.asarray(predictions), special_ids)).sum(axis=-1)  # output tokens only
        return {
            "bleu": scores["bleu"],
            "chrf": scores["chrf"],
            "gen_len": float(np.mean(lengths)) if len(lengths) else 0.0,
        }

    return compute_metrics


def score_corpus(hypotheses: list[str], references: list[str], *, bleu_tokenize: str | None = None) -> dict:
    """Corpus BLEU and chrF with their sacreBLEU signatures (one reference per sentence).

    With the package installed: its translation metric's computation (``translation_scores`` of
    attention_seq2seq/evaluate_modules/translation_scores, which adds ``bleu_lowercase`` and its
    signature). Without it (this file run next to an export, with transformers and sacrebleu
    alone): the same sacrebleu calls, written out here; both give the same numbers and signatures.

    Raises:
        ValueError: ``hypotheses`` or ``references`` is a single string (sacreBLEU would score
            each of its characters as a sentence), or the two differ in length.
    """
    try:
        from attention_seq2seq.evaluate_modules.translation_scores import compute_scores as module
    except ImportError:
        module = None
    if module is not None:
        return module.translation_scores(hypotheses, references, tokenize=bleu_tokenize)

    import sacrebleu

    for name, sentences in (("hypotheses", hypotheses), ("references", references)):
        if isinstance(sentences, str):
            raise ValueError(f"{name} must be a list of strings, one per sentence; got a single string")
    if len(hypotheses) != len(references):
        raise ValueError(f"got {len(hypotheses)} hypotheses for {len(references)} references")

    bleu = sacrebleu.BLEU(**({"tokenize": bleu_tokenize} if bleu_tokenize else {}))
    chrf = sacrebleu.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": bleu_score.score,
        "chrf": chrf_score.score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }


def decode_ids(tokenizer, ids, pad_id: int) -> list[str]:
    """Decode a padded id array, reading every negative id (-100 padding) as ``pad_id``."""
    ids = np.asarray(ids)
    ids = np.where(ids < 0, pad_id, ids)
    return [text.strip() for text in tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True)]


# --------------------------------------------------------------------------------------------
# Model and data


def resolve_model_path(base_model: str) -> str:
    """What ``from_pretrained`` takes: ``<run>/model`` for a training output folder, else the
    folder or Hub id as given.

    A name that is not a local folder is a Hub id, unless it is written as a path (``./runs/x``,
    ``/abs/x``, ``~/x`` or with two slashes or more): then it is a missing folder.
    """
    path = Path(base_model).expanduser()
    if (path / "model" / "config.json").is_file():
        return str(path / "model")
    if path.is_dir() and not (path / "config.json").is_file():
        raise FileNotFoundError(f"base_model: {path} holds no model (no config.json, no model/config.json)")
    if not path.exists() and (base_model.startswith((".", "/", "~")) or base_model.count("/") > 1):
        raise FileNotFoundError(f"base_model: folder not found: {base_model}")
    return base_model


def load_model_and_tokenizer(config: FinetuneConfig):
    """Model and tokenizer of ``config.base_model`` (remote code only with ``trust_remote_code``)."""
    try:  # registers both families with the Auto classes; absent where only the export is used
        import attention_seq2seq  # noqa: F401
    except ImportError:
        pass
    model_path = resolve_model_path(config.base_model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=config.trust_remote_code)
        model = AutoModelForSeq2SeqLM.from_pretrained(model_path, trust_remote_code=config.trust_remote_code)
    except OSError as err:  # an offline or unknown Hub id, a half-written folder
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise FileNotFoundError(f"base_model: cannot load {config.base_model}: {first_line}") from None
    return model, tokenizer


def load_pairs(config: FinetuneConfig):
    """The splits (``train``, and ``validation``/``test`` where given) and the corpus description.

    Returns ``(DatasetDict of source/target strings, corpus dict for metrics.json)``.
    """
    from datasets import DatasetDict, load_dataset

    if config.corpus:
        from attention_seq2seq.data import load_corpus  # the package's corpus specs

        splits, info = load_corpus(config.corpus, return_info=True)
        corpus = {
            key: getattr(info, key) for key in ("spec", "name", "source_lang", "target_lang", "license", "attribution")
        }
    else:
        files = {"train": config.train_file, "validation": config.validation_file, "test": config.test_file}
        files = {split: path for split, path in files.items() if path}
        for split, path in files.items():
            if not Path(path).is_file():
                raise FileNotFoundError(f"{split}_file not found: {path}")
        splits = load_dataset("json", data_files=files)
        for split, dataset in splits.items():
            missing = {"source", "target"} - set(dataset.column_names)
            if missing:
                raise ValueError(
                    f"{files[split]}: each line needs the keys 'source' and 'target'; missing {sorted(missing)}"
                )
        corpus = {
            "spec": f"jsonl:{config.train_file}",
            "name": Path(config.train_file).stem,
            "source_lang": None,
            "target_lang": "zh" if _target_is_chinese(splits["train"]) else None,
        }
    limits = {"train": config.max_train_samples, "validation": config.max_eval_samples, "test": config.max_test_samples}
    out = {}
    for split, dataset in splits.items():
        if limits.get(split) and len(dataset) > limits[split]:
            dataset = dataset.select(range(limits[split]))
        out[split] = dataset
    return DatasetDict(out), corpus


def tokenize_pairs(dataset, tokenizer, config: FinetuneConfig):
    """``input_ids``/``attention_mask`` from the source, ``labels`` from the target (both end in </s>)."""

    def encode(batch):
        encoded = tokenizer(batch["source"], max_length=config.max_source_length, truncation=True)
        targets = tokenizer(text_target=batch["target"], max_length=config.max_target_length, truncation=True)
        encoded["labels"] = targets["input_ids"]
        return encoded

    return dataset.map(encode, batched=True, remove_columns=dataset.column_names, desc="tokenize")


def evaluation_generation_config(model, config: FinetuneConfig):
    """The model's generation settings with the evaluation's beam size and length made explicit."""
    generation_config = model.generation_config.__class__.from_dict(model.generation_config.to_dict())
    generation_config.num_beams = config.generation_num_beams
    generation_config.max_new_tokens = config.generation_max_new_tokens
    generation_config.max_length = None  # max_new_tokens decides; the 20-token default never applies
    generation_config.do_sample = False
    return generation_config


# --------------------------------------------------------------------------------------------
# LoRA (peft is an optional dependency: imported only when a run asks for it)

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
    from torch import nn

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
    import re

    from torch import nn

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


def apply_lora(model, config: FinetuneConfig):
    """``model`` wrapped by peft's LoRA on `resolve_lora_targets` of ``config.lora_target_modules``.

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


def lora_parameter_counts(peft_model) -> tuple[int, int]:
    """(trainable, total) parameters as peft's ``print_trainable_parameters`` counts them
    (total = base + adapters; tied weights once)."""
    trainable, total = peft_model.get_nb_trainable_parameters()
    return int(trainable), int(total)


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


def _check_batch(collator, dataset, device, n: int = 8) -> dict | None:
    """The first ``n`` examples of a tokenized split, collated and on ``device`` (None when empty)."""
    if dataset is None or len(dataset) == 0:
        return None
    batch = collator([dataset[i] for i in range(min(n, len(dataset)))])
    return {key: value.to(device) for key, value in batch.items()}


def merge_command(output_dir: str | Path) -> str:
    return f"attention-seq2seq finetune --merge-adapter {output_dir}"


def _write_lora_readme(output_dir: Path, lora: dict) -> None:
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


def merge_adapter(run_dir: str | Path, *, base_model: str | None = None) -> Path:
    """Merge the adapter of a finished LoRA run into its base model and write ``<run_dir>/model``.

    The base is the run's ``recipe.yaml`` ``base_model`` (a path is read from the working
    directory, as during the run) unless ``base_model`` is given. ``metrics.json`` records the
    merge and the largest teacher-forced logit difference between adapted and merged model on
    two fixed sentences. Returns the model folder.

    Raises:
        FileNotFoundError: no ``adapter/adapter_config.json`` or ``recipe.yaml`` in ``run_dir``.
        FileExistsError: ``run_dir/model`` exists already (nothing is overwritten).
        ImportError: peft is missing.
    """
    run_dir = Path(run_dir)
    adapter_dir = run_dir / "adapter"
    if not (adapter_dir / "adapter_config.json").is_file():
        raise FileNotFoundError(f"merge_adapter: {adapter_dir} holds no LoRA adapter (adapter_config.json)")
    if not (run_dir / "recipe.yaml").is_file():
        raise FileNotFoundError(f"merge_adapter: {run_dir} has no recipe.yaml (the base model's name)")
    model_dir = run_dir / "model"
    if model_dir.exists():
        raise FileExistsError(f"merge_adapter: {model_dir} exists already; remove it to merge again")
    peft = require_peft()
    values = load_recipe(run_dir / "recipe.yaml")
    config = FinetuneConfig(**{**values, **({"base_model": base_model} if base_model else {})})
    model, tokenizer = load_model_and_tokenizer(config)
    adapted = peft.PeftModel.from_pretrained(model, str(adapter_dir))
    sentences = ["A man is walking his dog in the park.", "Two children are playing on the beach."]
    batch = tokenizer(sentences, text_target=sentences, padding=True, return_tensors="pt")
    batch["labels"] = batch["labels"].masked_fill(batch["labels"] == (tokenizer.pad_token_id or 0), -100)
    merged, difference = merge_lora(adapted, dict(batch))
    partial = run_dir / "model.partial"
    merged.save_pretrained(str(partial))
    tokenizer.save_pretrained(str(partial))
    partial.rename(model_dir)
    metrics_path = run_dir / "metrics.json"
    if metrics_path.is_file():
        metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
        lora = metrics.setdefault("lora", {})
        lora.update(merged=True, merge_max_abs_logit_difference=difference)
        lora.pop("merge_command", None)
        metrics_path.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        if {"r", "alpha", "dropout", "target_modules", "trainable_parameters", "total_parameters"} <= set(lora):
            _write_lora_readme(run_dir, lora)
    return model_dir


def check_output_dir(config: FinetuneConfig) -> str | None:
    """The checkpoint a run continues from (None: it starts), after refusing to overwrite an earlier run.

    Raises:
        FileExistsError: ``output_dir`` holds checkpoints or a finished run (model/, adapter/,
            metrics.json) and ``resume`` is off.
    """
    output_dir = Path(config.output_dir)
    checkpoints = sorted(
        (path for path in (output_dir / "checkpoints").glob("checkpoint-*") if path.name.split("-")[-1].isdigit()),
        key=lambda path: int(path.name.split("-")[-1]),
    )
    written = [name for name in ("model", "adapter", "metrics.json") if (output_dir / name).exists()]
    if not config.resume and (checkpoints or written):
        held = ", ".join(written + (["checkpoints/"] if checkpoints else []))
        raise FileExistsError(
            f"output_dir {output_dir} already holds {held}: pass --resume to continue its run "
            "(recipe: resume: true) or choose another output_dir"
        )
    return str(checkpoints[-1]) if checkpoints else None


# --------------------------------------------------------------------------------------------
# The run


def build_trainer(config: FinetuneConfig, model, tokenizer, datasets, *, bleu_tokenize: str | None = None):
    """A ``Seq2SeqTrainer`` over tokenized splits, writing into ``<output_dir>/checkpoints``."""
    output_dir = Path(config.output_dir)
    has_validation = "validation" in datasets
    eval_steps = config.eval_steps if config.eval_steps else config.max_steps
    if config.report_to == "tensorboard":
        # transformers 5 reads the TensorBoard folder from this variable (logging_dir is gone).
        os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(output_dir / "logs"))
    launched_processes = int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun / accelerate launch
    args = Seq2SeqTrainingArguments(
        output_dir=str(output_dir / "checkpoints"),
        # Without CUDA, a multi-process launch forms one gloo process group only on the CPU path;
        # otherwise every process would train its own copy on all the data, silently.
        use_cpu=launched_processes > 1 and not torch.cuda.is_available(),
        max_steps=config.max_steps,
        per_device_train_batch_size=config.per_device_train_batch_size,
        per_device_eval_batch_size=config.per_device_eval_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        learning_rate=config.learning_rate,
        lr_scheduler_type=config.lr_scheduler_type,
        warmup_steps=config.warmup_steps,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        # Label smoothing is the model's own (config.label_smoothing, set in finetune()): Trainer's
        # label smoother would pop the labels and need the collator to build decoder_input_ids.
        label_smoothing_factor=0.0,
        activation_checkpointing=config.gradient_checkpointing,  # 5.24's name for gradient checkpointing
        bf16=config.bf16,
        fp16=config.fp16,
        seed=config.seed,
        eval_strategy="steps" if has_validation else "no",
        eval_steps=eval_steps,
        logging_steps=config.logging_steps,
        save_strategy="steps",
        save_steps=config.save_steps or eval_steps,
        save_total_limit=config.save_total_limit or None,
        predict_with_generate=True,
        generation_config=evaluation_generation_config(model, config),
        report_to=config.report_to,
        remove_unused_columns=False,  # the tokenized columns are exactly the model's inputs
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
    )
    if args.world_size != launched_processes:
        raise RuntimeError(
            f"launched {launched_processes} processes but the Trainer formed a group of {args.world_size}"
        )
    collator = DataCollatorForSeq2Seq(
        tokenizer,
        model=model,
        label_pad_token_id=-100,
        pad_to_multiple_of=8 if (config.bf16 or config.fp16) else None,  # tensor-core friendly shapes
    )
    trainer = Seq2SeqTrainerWithPerplexity(
        model=model,
        args=args,
        data_collator=collator,
        train_dataset=datasets["train"],
        eval_dataset=datasets["validation"] if has_validation else None,
        processing_class=tokenizer,
        compute_metrics=build_compute_metrics(tokenizer, bleu_tokenize=bleu_tokenize),
    )
    if hasattr(model, "get_base_model"):
        # A peft model: the Trainer set the evaluation's settings on the wrapper, but generate()
        # runs on the base model and reads the base's own; give the base the same object.
        model.get_base_model().generation_config = trainer.model.generation_config
    return trainer


class Seq2SeqTrainerWithPerplexity(Seq2SeqTrainer):
    """``Seq2SeqTrainer`` whose evaluation loss is plain cross-entropy.

    Both model families apply ``config.label_smoothing`` inside ``forward``; evaluation turns it
    off so that ``eval_loss`` is the true per-token cross-entropy and exp(eval_loss) the
    perplexity (a smoothed loss overstates it).
    """

    def evaluate(self, *args, **kwargs):
        with _without_label_smoothing(self.model):
            return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        with _without_label_smoothing(self.model):
            return super().predict(*args, **kwargs)


class _without_label_smoothing:
    """Context manager: ``model.config.label_smoothing`` is 0 inside, restored on exit."""

    def __init__(self, model) -> None:
        self.config = model.config
        self.saved = getattr(self.config, "label_smoothing", 0.0)

    def __enter__(self) -> None:
        self.config.label_smoothing = 0.0

    def __exit__(self, *exc) -> None:
        self.config.label_smoothing = self.saved


def _target_is_chinese(dataset) -> bool:
    """True when most target sentences contain CJK characters (sacrebleu's BLEU then needs tok=zh)."""
    sample = dataset["target"][:50] if "target" in dataset.column_names else []
    cjk = sum(any("\u4e00" <= ch <= "\u9fff" for ch in text) for text in sample)
    return bool(sample) and cjk > len(sample) // 2


def finetune(config: FinetuneConfig) -> Path:
    """Fine-tune ``config.base_model`` and write the output folder; returns ``output_dir``.

    A full run writes ``model/``; a LoRA run (``config.lora``) writes ``adapter/`` (peft's
    ``save_pretrained``: adapter_config.json, adapter_model.safetensors, with the tokenizer), a
    README.md, and with ``config.merge`` also ``model/``, the merged plain model. Both write
    metrics.json and recipe.yaml.

    Raises:
        FileExistsError: ``output_dir`` holds an earlier run and ``config.resume`` is off.
        ImportError: ``config.lora`` without peft installed.
        ValueError: an invalid setting (`FinetuneConfig.validate`, `resolve_lora_targets`).
    """
    config.validate()
    if config.lora:
        require_peft()
    resume_from = check_output_dir(config)
    set_seed(config.seed)
    output_dir = Path(config.output_dir)
    model, tokenizer = load_model_and_tokenizer(config)
    if config.gradient_checkpointing and not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"gradient_checkpointing: {model.config.model_type} models do not support it; set it to false")
    model.config.label_smoothing = config.label_smoothing  # both families smooth in forward(labels=)
    deploy_generation_config = model.generation_config  # restored before saving (see below)
    lora = None
    if config.lora:
        model = apply_lora(model, config)
        trainable, total = lora_parameter_counts(model)
        lora = {
            "r": config.lora_r,
            "alpha": config.lora_alpha,
            "dropout": config.lora_dropout,
            "target_modules": list(model.peft_config["default"].target_modules),
            "trainable_parameters": trainable,
            "total_parameters": total,
            "adapter_dir": "adapter",
        }
        if int(os.environ.get("RANK", "0")) == 0:
            suffixes = sorted({name.rsplit(".", 1)[-1] for name in lora["target_modules"]})
            print(
                f"LoRA r={config.lora_r} alpha={config.lora_alpha} dropout={config.lora_dropout} on "
                f"{len(lora['target_modules'])} modules ({', '.join(suffixes)})"
            )
            model.print_trainable_parameters()
    raw, corpus = load_pairs(config)
    bleu_tokenize = "zh" if corpus.get("target_lang") == "zh" else None  # sacreBLEU's advice for Chinese
    tokenized = {split: tokenize_pairs(dataset, tokenizer, config) for split, dataset in raw.items()}

    trainer = build_trainer(config, model, tokenizer, tokenized, bleu_tokenize=bleu_tokenize)
    start = time.perf_counter()
    train_result = trainer.train(resume_from_checkpoint=resume_from)
    wall_time = time.perf_counter() - start

    test_scores = {}
    if "test" in tokenized:
        prediction = trainer.predict(tokenized["test"], metric_key_prefix="test")
        hypotheses = decode_ids(tokenizer, prediction.predictions, tokenizer.pad_token_id or 0)
        test_scores = score_corpus(hypotheses, list(raw["test"]["target"]), bleu_tokenize=bleu_tokenize)

    # The saved model keeps the base model's generation settings, not the evaluation's.
    trainer.model.generation_config = deploy_generation_config
    if lora is not None:
        trainer.model.get_base_model().generation_config = deploy_generation_config
    if trainer.is_world_process_zero():
        if lora is None:
            trainer.save_model(str(output_dir / "model"))
            tokenizer.save_pretrained(str(output_dir / "model"))
        else:
            adapted = trainer.accelerator.unwrap_model(trainer.model)
            adapted.save_pretrained(str(output_dir / "adapter"))
            tokenizer.save_pretrained(str(output_dir / "adapter"))
            lora["merged"] = config.merge
            if config.merge:
                check = tokenized.get("validation", tokenized["train"])
                batch = _check_batch(trainer.data_collator, check, trainer.args.device)
                merged, lora["merge_max_abs_logit_difference"] = merge_lora(adapted, batch)
                merged.generation_config = deploy_generation_config
                merged.save_pretrained(str(output_dir / "model"))
                tokenizer.save_pretrained(str(output_dir / "model"))
            else:
                lora["merge_command"] = merge_command(output_dir)
            _write_lora_readme(output_dir, lora)
        write_run_files(config, trainer, train_result, wall_time, test_scores, raw, corpus, lora=lora)
        if lora is not None and not config.merge:
            print(f"LoRA adapter written to {output_dir / 'adapter'}; merge it into a plain model with:")
            print(f"  {merge_command(output_dir)}")
    return output_dir


def _loss_history(trainer) -> list[dict]:
    return [entry for entry in trainer.state.log_history if "loss" in entry and "eval_loss" not in entry]


def write_run_files(
    config, trainer, train_result, wall_time, test_scores, raw, corpus: dict, *, lora: dict | None = None
) -> None:
    """metrics.json and recipe.yaml in the layout of docs/DESIGN.md (what the exporter reads).

    ``lora`` (a LoRA run): its settings, parameter counts and merge state, stored as metrics.json's
    ``lora`` entry."""
    output_dir = Path(config.output_dir)
    losses = _loss_history(trainer)
    validation = [
        {
            "step": entry["step"],
            "loss": entry["eval_loss"],
            "perplexity": math.exp(min(entry["eval_loss"], 50.0)),
            "bleu": entry.get("eval_bleu"),
            "chrf": entry.get("eval_chrf"),
        }
        for entry in trainer.state.log_history
        if "eval_loss" in entry
    ]
    metrics: dict[str, Any] = {
        "model_family": trainer.model.config.model_type,
        # What `attention-seq2seq export` puts in the card's `base_model` when it is a Hub id.
        "base_model": config.base_model_id or config.base_model,
        "base_model_path": config.base_model,
        "finetuned_with": "transformers.Seq2SeqTrainer" + (" + peft LoRA" if lora is not None else ""),
        "corpus": corpus,
        "train": {
            "steps": trainer.state.global_step,
            "epochs": trainer.state.epoch,
            "wall_time_s": wall_time,
            "train_samples": len(raw["train"]),
            "final_train_loss": losses[-1]["loss"] if losses else train_result.training_loss,
            "loss_history": [{"step": e["step"], "loss": e["loss"]} for e in losses],
        },
        "validation": validation,
        "test": {},
    }
    if lora is not None:
        metrics["lora"] = lora
    if test_scores:
        corpus_test = f"{metrics['corpus']['name']}-test".replace(" ", "-")
        name = Path(config.test_file).stem if config.test_file else corpus_test
        metrics["test"][name] = {
            "split": "test",
            "num_sentences": len(raw["test"]),
            "num_beams": config.generation_num_beams,
            "max_new_tokens": config.generation_max_new_tokens,
            **test_scores,
        }
    (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    _write_recipe(config, output_dir / "recipe.yaml")


def _write_recipe(config: FinetuneConfig, path: Path) -> None:
    values = dataclasses.asdict(config)
    try:
        import yaml

        text = "# Resolved fine-tuning recipe (re-run: attention-seq2seq finetune --recipe this-file)\n"
        text += yaml.safe_dump(values, sort_keys=False)
    except ImportError:  # pyyaml is a package dependency, but this file also runs without the package
        text = json.dumps(values, indent=2) + "\n"
    path.write_text(text, encoding="utf-8")


# --------------------------------------------------------------------------------------------
# Command line (shared with `attention-seq2seq finetune`)


def load_recipe(path: str | Path) -> dict:
    """A recipe file (YAML or JSON) as a dict; unknown keys raise ``ValueError`` naming them."""
    from .config import load_recipe as read_recipe  # one reader: UTF-8, YAML and JSON errors as one line

    values = read_recipe(path)
    known = {f.name for f in fields(FinetuneConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{path}: unknown field(s) {', '.join(unknown)}; valid fields: {', '.join(sorted(known))}")
    return values


def add_config_arguments(parser: argparse.ArgumentParser, comments: dict[str, str] | None = None) -> None:
    """One ``--field-name`` option per ``FinetuneConfig`` field; ``comments`` are their help texts.

    Options left out stay ``None``, so the recipe's value (or the field's default) applies.
    """
    comments = comments or {}
    parser.add_argument("--recipe", help="YAML or JSON file of fields; options given here override it")
    parser.add_argument(
        "--merge-adapter",
        metavar="RUN_DIR",
        help="merge the adapter of a finished LoRA run (RUN_DIR/adapter) into its base model and write "
        "RUN_DIR/model; --base-model overrides the base named in RUN_DIR/recipe.yaml; nothing is trained",
    )
    parser.add_argument("--merge_adapter", dest="merge_adapter", help=argparse.SUPPRESS)
    for f in fields(FinetuneConfig):
        flag = "--" + f.name.replace("_", "-")
        # the training command's spelling (--max_steps, --output_dir) works too, undocumented
        hidden = [f"--{f.name}"] if "_" in f.name else []
        text = f"{comments[f.name]} " if comments.get(f.name) else ""
        if f.type in ("bool", bool):
            parser.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{text}(default: {f.default})",
            )
            for alias in hidden:
                parser.add_argument(alias, dest=f.name, action="store_true", default=None, help=argparse.SUPPRESS)
        else:
            kind = {"int": int, "float": float}.get(str(f.type), str)
            parser.add_argument(
                flag,
                dest=f.name,
                type=kind,
                default=None,
                metavar={int: "N", float: "X"}.get(kind, "TEXT"),
                help=f"{text}(default: {f.default!r})".replace("%", "%%"),
            )
            for alias in hidden:
                parser.add_argument(alias, dest=f.name, type=kind, default=None, help=argparse.SUPPRESS)


def config_from_args(args: argparse.Namespace) -> FinetuneConfig:
    values = load_recipe(args.recipe) if args.recipe else {}
    for f in fields(FinetuneConfig):
        given = getattr(args, f.name, None)
        if given is not None:
            values[f.name] = given
    config = FinetuneConfig(**values)
    config.validate()
    if config.lora:
        require_peft()  # before anything is loaded
    return config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="finetune_trainer",
        description="Fine-tune an attention-seq2seq model with transformers' Seq2SeqTrainer.",
        epilog=__doc__.split("Examples::", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    try:
        if args.merge_adapter:
            model_dir = merge_adapter(args.merge_adapter, base_model=args.base_model)
            print(f"merged model written to {model_dir}", file=sys.stderr)
            return 0
        config = config_from_args(args)
    except (ValueError, FileNotFoundError, FileExistsError, ImportError, TypeError) as err:
        parser.error(str(err))
    try:
        output_dir = finetune(config)
    except (FileExistsError, ImportError, LoraSettingError) as err:  # one-line errors found after loading
        parser.error(str(err))
    if int(os.environ.get("RANK", "0")) == 0:
        written = "model" if (output_dir / "model").is_dir() else "adapter"
        print(f"fine-tuned {written} written to {output_dir / written}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
