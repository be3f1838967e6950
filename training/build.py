"""The pieces a training run is built from: accelerator, data, tokenizer, model, optimizer,
learning-rate schedule and logging. ``train.py`` calls them in order; each one is usable alone
(the tests build single pieces)."""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs, broadcast_object_list

from ..data.pairs import Collate, PairDataset
from ..modeling.registry import BY_NAME
from .config import RecipeError
from .schedules import LearningRateSchedule
from .train_config import TrainConfig

logger = logging.getLogger("attention_seq2seq.training")


def build_subword_resampling(config: TrainConfig, train_split, train_set: PairDataset, tokenizer, accelerator):
    """The per-epoch subword resampling of ``subword_alpha`` / ``bpe_dropout``, or None when off.

    Returns ``resample(epoch) -> bool``: on the first call for an epoch, the main process draws
    a new segmentation of every training pair (:class:`~attention_seq2seq.data.tokenization.SubwordSampler`;
    a side whose sample is over its length limit keeps its best segmentation), every rank
    receives the same ids, and ``train_set`` is updated in place; later calls for the same
    epoch do nothing and return False.

    What stays deterministic: the set of pairs, and the step count that ``max_epochs`` turns
    into (computed from the best segmentation, so a resumed run gets the same schedule); the
    batches of an epoch follow its sampled lengths, so an epoch has a few more or fewer updates
    than the best segmentation gives, and ``max_epochs`` ends the run near, not exactly at, that
    many passes. Resuming mid-epoch draws the interrupted epoch anew (the sampled ids are not
    checkpointed, and the tokenizers library cannot be seeded) and skips as many batches as
    were consumed, so within that one epoch some pairs train twice and others not at all.

    Raises:
        RecipeError: the option does not fit the tokenizer (e.g. ``subword_alpha`` with a saved
            BPE tokenizer from ``tokenizer_path``).
    """
    if config.subword_alpha is None and config.bpe_dropout is None:
        return None
    from ..data.tokenization import SubwordSampler

    kind = type(tokenizer.backend_tokenizer.model).__name__
    origin = (
        f"the tokenizer from tokenizer_path {config.tokenizer_path}" if config.tokenizer_path else "the run's tokenizer"
    )
    if config.subword_alpha is not None and kind != "Unigram":
        raise RecipeError(
            f"subword_alpha samples unigram segmentations, but {origin} is {kind}; use bpe_dropout for BPE"
        )
    if config.bpe_dropout is not None and kind != "BPE":
        raise RecipeError(f"bpe_dropout needs a BPE tokenizer, but {origin} is {kind}; use subword_alpha for Unigram")
    subword = SubwordSampler(
        tokenizer, alpha=config.subword_alpha, nbest_size=config.subword_nbest_size, dropout=config.bpe_dropout
    )
    # the texts live on the main process only: it alone samples, the other ranks receive the ids
    sources, targets = (
        (train_split["source"][:], train_split["target"][:]) if accelerator.is_main_process else (None, None)
    )
    best_input_ids, best_labels = train_set.input_ids, train_set.labels
    best_tokens = sum(map(len, best_input_ids)) + sum(map(len, best_labels))
    done = {"epoch": None}

    def resample(epoch: int) -> bool:
        if done["epoch"] == epoch:
            return False
        payload = [None, None]
        if accelerator.is_main_process:
            input_ids, labels, kept = subword.resample(
                sources, targets, best_input_ids, best_labels, config.max_source_length, config.max_target_length
            )
            payload = [input_ids, labels]
            tokens = sum(map(len, input_ids)) + sum(map(len, labels))
            logger.info(
                "epoch %d: sampled segmentations, %.2fx the tokens of the best ones (%d sides over the "
                "length limit kept theirs)",
                epoch,
                tokens / max(1, best_tokens),
                kept,
            )
        if accelerator.num_processes > 1:
            broadcast_object_list(payload, from_process=0)
        train_set.input_ids, train_set.labels = payload
        done["epoch"] = epoch
        return True

    return resample


def build_accelerator(config: TrainConfig, output_dir: Path, mixed_precision: str | None = None) -> Accelerator:
    """The Accelerator of this run. ``accelerate launch --multi_gpu --num_processes N`` on a
    machine without CUDA starts N ranks that form one gloo group only if the Accelerator is built
    with ``cpu=True``; without it each rank would silently train its own copy of the model.
    ``mixed_precision`` is the resolved choice (never ``"auto"``); None: ``config.mixed_precision``.
    ``config.ddp_timeout`` bounds every collective's wait (gloo or NCCL), so a rank that hangs
    stops the others after that many seconds rather than torch's default 30 minutes."""
    multi_process = int(os.environ.get("WORLD_SIZE", "1")) > 1
    cpu = multi_process and not torch.cuda.is_available()
    timeout = datetime.timedelta(seconds=config.ddp_timeout)
    if timeout == InitProcessGroupKwargs().timeout:  # accelerate passes on only non-default fields: 600 s
        timeout += datetime.timedelta(milliseconds=1)  # would fall back to torch's 1800 s
    return Accelerator(
        cpu=cpu,
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timeout)],
        mixed_precision=mixed_precision or config.mixed_precision,
        log_with=None if config.log_with == "none" else config.log_with,
        project_dir=str(output_dir),
    )


def load_data(config: TrainConfig, accelerator: Accelerator, output_dir: Path):
    """Corpus, tokenizer and the tokenized corpus, through the prepared-corpus cache
    (data/prepared.py); returns ``(data, CorpusInfo, tokenizer)``.

    ``data["train"]`` is a :class:`~attention_seq2seq.data.prepared.PreparedPairs` (memory-mapped
    ids); ``data["validation"]`` / ``data["test"]`` are tokenized ``datasets.Dataset`` splits.
    With subword resampling on, ``data["train_text"]`` holds the kept training pairs' texts.

    Every rank calls the same preparation: the first one to take the cache entry's file lock
    builds it (tokenizer training included), the others wait and then map the same files. The
    tokenizer is copied to ``output_dir/model`` so a resumed run reads it back (subword training
    is not bitwise reproducible); a resumed run prepares its data with that copy.

    Training pairs longer than ``max_source_length`` / ``max_target_length`` are dropped;
    validation and test sources are truncated (every sentence is still scored).
    """
    from transformers import PreTrainedTokenizerFast

    from ..common.durability import unwritable
    from ..data.prepared import cache_root, prepare_corpus

    import datasets

    datasets.disable_progress_bars()  # seconds of work per split: the log states what matters
    tokenizer_dir = output_dir / "model"
    root = output_dir / "corpus_cache" if config.no_cache else cache_root()
    problem = None if config.no_cache else unwritable(root)
    if problem is not None:  # a read-only HOME or cache mount: this run keeps its data to itself
        logger.warning(
            "the corpus cache %s cannot be written (%s): preparing the data in %s for this run only "
            "(set ATTENTION_SEQ2SEQ_CACHE to a writable folder to share it between runs)",
            root,
            problem,
            output_dir / "corpus_cache",
        )
        root = output_dir / "corpus_cache"
    if config.no_cache and accelerator.is_main_process:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    accelerator.wait_for_everyone()
    prepared = prepare_corpus(
        config.corpus,
        filters=config.corpus_filters or None,
        max_train_pairs=config.max_train_samples,
        tokenizer_type=config.tokenizer_type,
        vocab_size=config.vocab_size,
        tokenizer_path=config.tokenizer_path,
        tokenizer_train_pairs=config.tokenizer_train_pairs,
        tokenizer_dir=tokenizer_dir if (tokenizer_dir / "tokenizer.json").exists() else None,
        max_source_length=config.max_source_length,
        max_target_length=config.max_target_length,
        root=root,
    )
    logger.info(
        "prepared corpus %s: %s (%d training pairs)",
        "built in" if prepared.built else "read from",
        prepared.folder,
        len(prepared.train),
    )
    if len(prepared.train) == 0:  # every pair longer than a limit (the corpus itself has pairs)
        read = prepared.meta.get("train_pairs_read", "the")
        raise RecipeError(
            f"max_source_length {config.max_source_length} / max_target_length {config.max_target_length} "
            f"leave no training pair: all {read} pairs of {config.corpus} are longer in tokens (</s> included); "
            "raise them (128 is usual)"
        )
    if accelerator.is_main_process and not (tokenizer_dir / "tokenizer.json").exists():
        import shutil

        # the bytes as they are, so a resumed run's hash of model/tokenizer.json finds this entry;
        # copyfile, not copytree/copy2: the run's files get the mode of the run's umask
        tokenizer_dir.mkdir(parents=True, exist_ok=True)
        # tokenizer.json last: its presence is what says the copy is complete
        for path in sorted(prepared.tokenizer_dir.iterdir(), key=lambda p: (p.name == "tokenizer.json", p.name)):
            if path.is_file():  # whole or absent: a kill mid-copy must not leave a cut tokenizer.json
                partial = tokenizer_dir / f".{path.name}.partial"
                shutil.copyfile(path, partial)
                os.replace(partial, tokenizer_dir / path.name)
    accelerator.wait_for_everyone()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    data = {"train": prepared.train, **prepared.splits}
    if config.subword_alpha is not None or config.bpe_dropout is not None:
        data["train_text"] = _training_texts(config, prepared.train.kept_indices())
    return data, prepared.info, tokenizer


def _training_texts(config: TrainConfig, kept):
    """The texts of the prepared training pairs (subword resampling segments them anew each epoch)."""
    from ..data.corpora import load_corpus

    raw = load_corpus(config.corpus, filters=config.corpus_filters or None)["train"]
    if config.max_train_samples is not None:
        raw = raw.select(range(min(config.max_train_samples, len(raw))))
    return raw.select(kept)


def optimizer_param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: decay for weight matrices and embeddings, none for the rest.

    Parameters with two or more dimensions (linear and recurrent weight matrices, embeddings;
    the tied `lm_head` is the embedding, listed once) get `weight_decay`; vectors (biases,
    LayerNorm gains and shifts, attention vectors such as Bahdanau's v_a) get 0, as in BERT and
    transformers' Trainer: shrinking a LayerNorm gain towards 0 rescales a whole layer rather
    than regularising it. Frozen parameters (requires_grad False) are left out.

    Returns:
        Two groups, `[{"params": decayed, "weight_decay": weight_decay}, {"params": rest,
        "weight_decay": 0.0}]` (an empty group is dropped), or, for `weight_decay` 0, one group of
        every parameter: the optimizer state checkpoints written before the groups existed had
        one, and a run resumed from them keeps working.
    """
    if weight_decay == 0:
        return [{"params": [param for param in model.parameters() if param.requires_grad], "weight_decay": 0.0}]
    decay, no_decay = [], []
    for param in model.parameters():  # parameters() yields a shared (tied) tensor once
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def resolve_precision(config: TrainConfig):
    """``config.mixed_precision`` made concrete: a :class:`~.precision.PrecisionChoice` for
    ``"auto"`` (by the device's declared features: training/precision.py), None for any other
    value (used as it is)."""
    if config.mixed_precision != "auto":
        return None
    from .precision import resolve_mixed_precision

    return resolve_mixed_precision()


def build_model(config: TrainConfig, tokenizer):
    family = BY_NAME[config.model_family]
    config_cls, model_cls = family.config_cls(), family.lm_cls()
    reserved = {
        "vocab_size",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "decoder_start_token_id",
        "label_smoothing",
    }
    clash = sorted(reserved & set(config.model_config))
    if clash:
        raise RecipeError(f"model_config may not set {clash}: they come from the tokenizer / label_smoothing")
    model_config = config_cls(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
        label_smoothing=config.label_smoothing,
        **config.model_config,
    )
    model = model_cls(model_config)
    gen = model.generation_config
    gen.num_beams = config.test_num_beams
    gen.length_penalty = config.length_penalty
    gen.max_new_tokens = config.max_target_length
    gen.decoder_start_token_id = model_config.decoder_start_token_id
    gen.eos_token_id = model_config.eos_token_id
    gen.pad_token_id = model_config.pad_token_id
    return model


class _QuietCheckpointNotices(logging.Filter):
    """safetensors stores a tied matrix once; Accelerate warns about it on every save."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Removed shared tensor" not in record.getMessage()


def setup_logging(is_main: bool) -> None:
    """INFO on the main process, WARNING elsewhere; quiet Accelerate's and transformers' per-save notices."""
    logger.setLevel(logging.INFO if is_main else logging.WARNING)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
    data_logger = logging.getLogger("attention_seq2seq.data")  # corpus preparation: counts and timings
    data_logger.setLevel(logging.INFO if is_main else logging.WARNING)
    if not data_logger.handlers:
        data_logger.addHandler(logger.handlers[0])
    logging.getLogger("accelerate").setLevel(logging.WARNING)
    import transformers

    transformers.utils.logging.disable_progress_bar()  # "Writing model shards": one file, a bar per save
    for name in ("accelerate.utils.other", "accelerate.checkpointing", "accelerate.accelerator"):
        target = logging.getLogger(name)
        if not any(isinstance(f, _QuietCheckpointNotices) for f in target.filters):
            target.addFilter(_QuietCheckpointNotices())


def build_train_loader(config: TrainConfig, train_set: PairDataset, tokenizer, accelerator):
    """``(sampler, loader)``: token-budget micro-batches of ``train_set``, sharded by rank."""
    from ..data.batching import TokenBudgetBatchSampler

    sampler = TokenBudgetBatchSampler(
        train_set.lengths(),
        max_tokens=config.max_tokens,
        shuffle=True,
        seed=config.seed,
        num_replicas=accelerator.num_processes,
        rank=accelerator.process_index,
        accumulation=config.gradient_accumulation_steps,  # N ranks = one process accumulating N
    )
    loader = torch.utils.data.DataLoader(
        train_set,
        batch_sampler=sampler,  # shards by rank itself: not handed to accelerator.prepare
        collate_fn=Collate(tokenizer.pad_token_id, tokenizer.bos_token_id),
        num_workers=config.num_workers,
        pin_memory=accelerator.device.type == "cuda",
        # Its own generator: a new epoch's iterator would otherwise draw a seed from the global
        # RNG, so a resumed run's dropout masks would drift from the uninterrupted run's.
        generator=torch.Generator().manual_seed(config.seed),
    )
    return sampler, loader


def build_optimizer(config: TrainConfig, model: torch.nn.Module, accelerator) -> torch.optim.AdamW:
    """AdamW over :func:`optimizer_param_groups`, fused on CUDA and CPU."""
    return torch.optim.AdamW(
        optimizer_param_groups(model, config.weight_decay),
        lr=config.learning_rate,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_epsilon,
        weight_decay=config.weight_decay,
        # torch's fused AdamW runs on CPU too: 31 -> 9 ms per step for 6M parameters here.
        fused=accelerator.device.type in ("cuda", "cpu"),
    )


def build_schedule(config: TrainConfig, optimizer, total_steps: int | None) -> LearningRateSchedule:
    """The run's :class:`~.schedules.LearningRateSchedule` (``schedule`` and its options)."""
    return LearningRateSchedule(
        optimizer,
        config.schedule,
        config.warmup_steps,
        total_steps,
        plateau_factor=config.plateau_factor,
        plateau_patience=config.plateau_patience,
        higher_is_better=config.early_stopping_metric != "loss",
        time_budget_s=60 * config.max_time_minutes if config.schedule == "linear_time" else None,
    )
