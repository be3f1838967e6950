"""Fine-tune a trained or exported model with transformers' ``Seq2SeqTrainer``.

This is the path a Hugging Face user already knows: ``Seq2SeqTrainer`` + ``DataCollatorForSeq2Seq``
with ``predict_with_generate`` and BLEU/chrF from the package's one translation metric
(``attention_seq2seq.TRANSLATION_METRIC_PATH``: the same BLEU and chrF as the package's own trainer
and ``evaluate`` command). It starts from any model this package wrote (a training output folder,
an export folder with ``trust_remote_code``, a plain model folder or a Hub id) and writes a folder
with the same layout as ``training/train.py``, so ``attention-seq2seq export`` turns it into a Hub
repo whose card names the base model. The data is a corpus spec of
``attention_seq2seq.data.load_corpus`` or JSONL files (``{"source": ..., "target": ...}`` per line).

The recipe is ``FinetuneConfig`` (training/config.py), LoRA is training/lora.py, and the command
is ``attention-seq2seq finetune`` (attention_seq2seq/cli/training.py).

Examples::

    attention-seq2seq finetune --recipe training/recipes/finetune-bible-multi30k.yaml

    # several GPUs: the Trainer runs on Accelerate, any launcher works
    torchrun --nproc_per_node 4 -m attention_seq2seq.training.finetune_trainer --recipe ...
    accelerate launch -m attention_seq2seq.training.finetune_trainer --recipe ...

``per_device_train_batch_size`` is per process; the global batch is that times the number of
processes times ``gradient_accumulation_steps``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
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

from ..translation import scores
from .config import FinetuneConfig, dump_recipe, finetune_config, parse_command_line
from .lora import (
    apply_lora,
    merge_command,
    merge_lora,
    require_peft,
    write_lora_readme,
)


# --------------------------------------------------------------------------------------------
# Metrics


def build_compute_metrics(tokenizer, *, bleu_tokenize: str | None = None) -> Callable[[Any], dict]:
    """A ``compute_metrics`` for ``Seq2SeqTrainer(predict_with_generate=True)``: BLEU and chrF.

    Predictions and labels arrive as padded integer arrays. The Trainer pads predictions of
    different batches to one width with -100, and labels carry -100 wherever the loss ignores a
    position; -100 is not a token id, so both are replaced by the pad id before decoding, and
    decoding drops special tokens, giving the plain detokenized text sacrebleu expects.
    ``bleu_tokenize`` is sacrebleu's tokenizer ("13a" by default; "zh" for Chinese targets).
    The scores come from ``evaluate.load`` of the package's translation metric
    (``translation.scores.load_translation_metric``, in memory: no cache file per process).
    """
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    special_ids = np.array(sorted(set(tokenizer.all_special_ids) | {-100}))
    metric = scores.load_translation_metric(keep_in_memory=True)

    def compute_metrics(eval_pred) -> dict:
        predictions, labels = eval_pred.predictions, eval_pred.label_ids
        if isinstance(predictions, tuple):  # (generated ids, ...) from some models
            predictions = predictions[0]
        hypotheses = decode_ids(tokenizer, predictions, pad_id)
        references = decode_ids(tokenizer, labels, pad_id)
        result = metric.compute(predictions=hypotheses, references=references, tokenize=bleu_tokenize)
        lengths = (~np.isin(np.asarray(predictions), special_ids)).sum(axis=-1)  # output tokens only
        return {
            "bleu": result["bleu"],
            "chrf": result["chrf"],
            "gen_len": float(np.mean(lengths)) if len(lengths) else 0.0,
        }

    return compute_metrics


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
        from ..data import load_corpus

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
    config = finetune_config(run_dir / "recipe.yaml", {"base_model": base_model} if base_model else None)
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
            write_lora_readme(run_dir, lora)
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


def _check_batch(collator, dataset, device, n: int = 8) -> dict | None:
    """The first ``n`` examples of a tokenized split, collated and on ``device`` (None when empty)."""
    if dataset is None or len(dataset) == 0:
        return None
    batch = collator([dataset[i] for i in range(min(n, len(dataset)))])
    return {key: value.to(device) for key, value in batch.items()}


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


@contextlib.contextmanager
def _without_label_smoothing(model):
    """``model.config.label_smoothing`` is 0 inside, restored on exit."""
    saved = getattr(model.config, "label_smoothing", 0.0)
    model.config.label_smoothing = 0.0
    try:
        yield
    finally:
        model.config.label_smoothing = saved


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
        trainable, total = model.get_nb_trainable_parameters()  # total = base + adapters, tied weights once
        lora = {
            "r": config.lora_r,
            "alpha": config.lora_alpha,
            "dropout": config.lora_dropout,
            "target_modules": list(model.peft_config["default"].target_modules),
            "trainable_parameters": int(trainable),
            "total_parameters": int(total),
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
        references = list(raw["test"]["target"])
        test_scores = scores.corpus_scores(hypotheses, references, target_lang=corpus.get("target_lang"))

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
            write_lora_readme(output_dir, lora)
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
    dump_recipe(config, output_dir / "recipe.yaml")


# --------------------------------------------------------------------------------------------
# python -m attention_seq2seq.training.finetune_trainer (what torchrun / accelerate launch run)


def main(argv: list[str] | None = None) -> int:
    """``--recipe FILE`` and ``--field value`` options, as ``attention-seq2seq finetune`` takes them."""
    try:
        output_dir = finetune(parse_command_line(FinetuneConfig, argv, prog="finetune_trainer"))
    except (ValueError, FileNotFoundError, FileExistsError, ImportError) as err:  # RecipeError, LoraSettingError
        print(f"finetune_trainer: error: {err}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) == 0:
        written = "model" if (output_dir / "model").is_dir() else "adapter"
        print(f"fine-tuned {written} written to {output_dir / written}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
