"""Train an attention seq2seq model with Accelerate: one command from one CPU to many GPUs.

    python -m attention_seq2seq.training.train --recipe training/recipes/multi30k-transformer-small.yaml
    accelerate launch --multi_gpu --num_processes 8 -m attention_seq2seq.training.train \\
        --recipe training/recipes/multi30k-transformer-small.yaml --mixed_precision bf16
    accelerate launch --multi_gpu --num_processes 2 -m attention_seq2seq.training.train ...  # 2 CPU ranks (gloo)

Every hyperparameter is a field of :class:`TrainConfig` below; a recipe (YAML or JSON) sets any of
them and ``--field value`` on the command line overrides the recipe (see ``training/config.py``).

How a step works (fairseq's recipe, written with Accelerate's primitives): each rank draws
``gradient_accumulation_steps`` token-budget micro-batches; the number of target tokens of the
whole update is summed over micro-batches and all-reduced over ranks; each micro-batch's
*summed* token loss is divided by that global count and back-propagated (DDP communicates only on
the last one, ``accelerator.no_sync``). The update therefore minimises the mean loss per target
token of the global batch, whatever the split into ranks and micro-batches: 2 × B accumulated is
one batch of 2B, and 2 ranks are one process with twice the batch.

Paths and runs
    Relative paths (the corpus spec's location, ``output_dir``, ``tokenizer_path``) are read from
    the working directory, like any path on a command line; the shipped recipes assume the
    repository root (``../shared/data/...``). Rerun the same command with ``--resume`` to continue
    from the newest checkpoint: the same data order, RNG states and schedule, so the run ends
    with the weights an uninterrupted run would have. Several machines: Accelerate's own options
    (``--num_machines``, ``--machine_rank``, ``--main_process_ip``); ``output_dir`` must then be
    on a shared file system (rank 0 writes the checkpoint, every rank its RNG state).

What a person watches
    A tqdm bar on the main process (loss, learning rate, target tokens/s), TensorBoard under
    ``output_dir/logs`` (``tensorboard --logdir runs/``), one line per validation, and attention
    heat-maps of fixed validation sentences in ``output_dir/plots`` after each validation.

Output folder layout and ``metrics.json``: docs/DESIGN.md, "Training output folder".
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import logging
import math
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, gather_object, set_seed
from tqdm.auto import tqdm

from ..modeling.modeling_transformer_seq2seq import label_smoothed_cross_entropy
from .averaging import average_checkpoints, load_averaged_weights
from .config import RecipeError, dump_recipe, parse_command_line
from .file_modes import give_ordinary_modes
from .metrics import corpus_scores, format_score
from .plotting import plot_cross_attentions
from .schedules import SCHEDULES, PlateauDecay, TimeBudget, build_scheduler

logger = logging.getLogger("attention_seq2seq.training")


@dataclass
class TrainConfig:
    # ---- model ---------------------------------------------------------------------------------
    model_family: str = "transformer"  # "rnn" or "transformer"
    model_config: dict = field(default_factory=dict)  # passed to RNNSeq2SeqConfig / TransformerSeq2SeqConfig (vocab size and special ids come from the tokenizer)
    # ---- data ----------------------------------------------------------------------------------
    corpus: str = "multi30k:../shared/data/multi30k:de-en"  # load_corpus spec (data/corpora.py); relative paths from the working directory
    corpus_filters: dict = field(default_factory=dict)  # CorpusFilters fields (dedup, max_length, max_ratio, ...), train split only
    max_train_examples: int | None = None  # use only the first N training pairs (quick runs, tests)
    tokenizer_type: str = "unigram"  # "unigram" (SentencePiece-style) or "bpe"; one joint vocabulary
    tokenizer_path: str | None = None  # a saved tokenizer folder to use instead of training one
    vocab_size: int = 8000  # subword vocabulary size, special tokens and byte pieces included
    max_source_length: int = 128  # tokens incl. </s>; longer training pairs are dropped, evaluation sources truncated
    max_target_length: int = 128  # tokens incl. </s>; also the generation limit (max_new_tokens)
    subword_alpha: float | None = None  # unigram tokenizers: re-segment the training pairs every epoch, sampling segmentations with probability ∝ P(x)^alpha (subword regularization, Kudo 2018); smaller alpha: more, shorter pieces; at most 1 without subword_nbest_size; None: the best segmentation always
    subword_nbest_size: int | None = None  # with subword_alpha: sample among the n best segmentations (>= 2); None: among all of them
    bpe_dropout: float | None = None  # BPE tokenizers: re-segment the training pairs every epoch, skipping each merge with this probability (Provilkov et al. 2020)
    # ---- batching ------------------------------------------------------------------------------
    max_tokens: int = 4096  # token budget of one micro-batch on one rank, padding included (see data/batching.py)
    gradient_accumulation_steps: int = 1  # micro-batches per optimizer update on each rank
    num_workers: int = 0  # DataLoader worker processes for collation (0: in the training process)
    # ---- optimisation --------------------------------------------------------------------------
    learning_rate: float = 5e-4  # peak learning rate (AdamW)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98  # 0.98 as in Vaswani et al. 2017, section 5.3
    adam_epsilon: float = 1e-8
    weight_decay: float = 0.0  # AdamW's decoupled weight decay (Loshchilov & Hutter 2019), applied to weight matrices and embeddings only: biases and LayerNorm gains are not decayed (optimizer_param_groups)
    max_grad_norm: float = 1.0  # clip the global gradient norm to this; 0 disables clipping
    label_smoothing: float = 0.1  # epsilon of the label-smoothed cross-entropy (Szegedy et al. 2016)
    source_word_dropout: float = 0.0  # replace each source subword (not </s>, not padding) by <unk> with this probability in training batches (word dropout: Gal & Ghahramani 2016; Sennrich & Zhang 2019 for small-data NMT): the encoder learns not to lean on any one token; 0: off
    rdrop_alpha: float = 0.0  # R-Drop (Liang et al. 2021, eq. 3): each micro-batch runs twice with different dropout masks and alpha/2 x the symmetric KL of the two predictions joins the loss; 2x the compute per update (halve max_tokens to keep it); 0: off
    schedule: str = "inverse_sqrt"  # "inverse_sqrt", "linear", "linear_time" (decays to 0 at the end of max_time_minutes), "constant" or "plateau" (training/schedules.py)
    warmup_steps: int = 4000  # optimizer updates of linear warm-up
    plateau_factor: float = 0.5  # "plateau": multiply the lr by this ...
    plateau_patience: int = 2  # ... after this many validations without improvement
    # ---- length of the run (the first limit reached ends it) -----------------------------------
    max_steps: int | None = None  # optimizer updates
    max_epochs: float | None = None  # passes over the training set
    max_time_minutes: float | None = None  # wall-clock budget of the training loop, checked after every update (every log_every updates on several ranks)
    # ---- validation ----------------------------------------------------------------------------
    eval_every: int = 1000  # validate every N updates (and at the end)
    eval_max_examples: int | None = 500  # validate on the first N validation pairs (None: all)
    eval_num_beams: int = 4  # beam size of the validation translations
    eval_batch_size: int = 64  # sentences per generation batch
    early_stopping_metric: str = "bleu"  # "bleu", "chrf" or "loss"; also used by keep_best_k and "plateau"
    early_stopping_patience: int | None = None  # stop after N validations without improvement (None: never)
    keep_best_k: int = 1  # keep the weights of the k best validations in best/
    average_best_k: int = 0  # final model = mean of the best k kept weights (needs keep_best_k >= k)
    average_last_k: int = 0  # final model = mean of the last k checkpoints (needs keep_last_checkpoints >= k)
    num_plot_sentences: int = 2  # attention heat-maps of the first N validation sentences at each validation
    # ---- test ----------------------------------------------------------------------------------
    test_num_beams: int = 5  # beam size of the final test-set evaluation (also saved in generation_config)
    length_penalty: float = 1.0  # beam search scores log p / length^length_penalty (saved in generation_config); tune it on validation
    test_max_examples: int | None = None  # evaluate on the first N test pairs (None: all)
    test_bootstrap: int | None = None  # also each test score's 95% confidence interval from N bootstrap resamples of the test sentences (Koehn 2004; metrics.json keys bleu_ci95, bleu_lowercase_ci95, chrf_ci95); 1000 is usual, about a second; None: no interval
    test_greedy: bool = False  # also score greedy decoding on the test set (metrics.json entry "<corpus>-test-greedy")
    # ---- checkpoints and output ----------------------------------------------------------------
    output_dir: str = "runs/train"  # the run folder (docs/DESIGN.md, "Training output folder")
    save_every: int = 1000  # accelerator.save_state every N updates (and at the end)
    keep_last_checkpoints: int = 2  # checkpoints/step_N folders kept (older ones are deleted)
    resume: bool = False  # continue from the newest checkpoint in output_dir/checkpoints
    # ---- system --------------------------------------------------------------------------------
    seed: int = 1234  # model init, dropout and data order
    num_threads: int | None = None  # torch intra-op CPU threads of each process (None: torch's default, one per core)
    mixed_precision: str | None = None  # "auto" (measure this model's training step in float32 and CPU bf16 on this machine, interleaved, and take bf16 only where it is >= 1.1x faster; the decision is cached per machine and model shape: training/precision.py), "no", "fp16" (GPU) or "bf16" (GPU, or a CPU with AVX512-BF16/AMX); None: what `accelerate launch/config` says, else "no"
    log_every: int = 50  # updates between progress/TensorBoard logs (each costs one host sync); with several ranks also how often linear_time reads the clock
    log_with: str = "tensorboard"  # "tensorboard" or "none"
    # ---- debugging (used by the tests) ---------------------------------------------------------
    debug_dump_batches: bool = False  # each rank writes its micro-batches' example ids to debug/batches_rank<R>.jsonl
    debug_crash_at_step: int | None = None  # raise right after update N (after its checkpoint) to test --resume


CHOICES = {
    "model_family": ("rnn", "transformer"),
    "tokenizer_type": ("unigram", "bpe"),
    "schedule": SCHEDULES,
    "early_stopping_metric": ("bleu", "chrf", "loss"),
    "mixed_precision": (None, "auto", "no", "fp16", "bf16"),
    "log_with": ("tensorboard", "none"),
}


def validate_config(config: TrainConfig) -> None:
    """Reject values that cannot work, naming the field and the valid values.

    Raises:
        RecipeError: a choice field outside its valid values, or inconsistent limits.
    """
    for name, valid in CHOICES.items():
        value = getattr(config, name)
        if value not in valid:
            raise RecipeError(f"{name} must be one of {', '.join(repr(v) for v in valid)}; got {value!r}")
    if config.max_steps is None and config.max_epochs is None and config.max_time_minutes is None:
        raise RecipeError("set at least one of max_steps, max_epochs, max_time_minutes")
    for name in ("max_tokens", "gradient_accumulation_steps", "eval_every", "save_every", "log_every", "keep_last_checkpoints"):
        if getattr(config, name) < 1:
            raise RecipeError(f"{name} must be >= 1; got {getattr(config, name)}")
    if config.num_threads is not None and config.num_threads < 1:
        raise RecipeError(f"num_threads must be >= 1 or null (torch's default); got {config.num_threads}")
    if config.schedule == "linear_time" and not (config.max_time_minutes and config.max_time_minutes > 0):
        raise RecipeError(f"schedule 'linear_time' decays to 0 at the end of the time budget: set max_time_minutes > 0; got {config.max_time_minutes}")
    if config.schedule == "linear" and config.max_steps is None and config.max_epochs is None:
        raise RecipeError("schedule 'linear' decays to 0 at max_steps (or max_epochs): set one, or use 'linear_time' with max_time_minutes")
    if config.average_best_k > config.keep_best_k:
        raise RecipeError(f"average_best_k ({config.average_best_k}) needs keep_best_k >= it; got keep_best_k={config.keep_best_k}")
    if config.average_last_k > config.keep_last_checkpoints:
        raise RecipeError(
            f"average_last_k ({config.average_last_k}) needs keep_last_checkpoints >= it; got {config.keep_last_checkpoints}"
        )
    if config.average_best_k and config.average_last_k:
        raise RecipeError("set average_best_k or average_last_k, not both")
    if config.subword_alpha is not None and not config.subword_alpha > 0:
        raise RecipeError(f"subword_alpha must be > 0 (or null: no sampling); got {config.subword_alpha}")
    if config.subword_alpha is not None and config.subword_nbest_size is None and config.subword_alpha > 1:
        raise RecipeError(f"subword_alpha above 1 needs subword_nbest_size (sampling over every segmentation takes alpha <= 1); got {config.subword_alpha}")
    if config.subword_nbest_size is not None and (config.subword_alpha is None or config.subword_nbest_size < 2):
        raise RecipeError(f"subword_nbest_size needs subword_alpha and must be >= 2 (or null: every segmentation); got {config.subword_nbest_size}")
    if config.bpe_dropout is not None and not 0.0 < config.bpe_dropout < 1.0:
        raise RecipeError(f"bpe_dropout must be in (0, 1) (or null: no dropout); got {config.bpe_dropout}")
    if config.subword_alpha is not None and config.bpe_dropout is not None:
        raise RecipeError("set subword_alpha (unigram tokenizers) or bpe_dropout (BPE tokenizers), not both")
    if not config.tokenizer_path:  # a saved tokenizer's type is checked once it is loaded
        if config.subword_alpha is not None and config.tokenizer_type != "unigram":
            raise RecipeError(f"subword_alpha samples unigram segmentations; tokenizer_type is {config.tokenizer_type!r} (use bpe_dropout)")
        if config.bpe_dropout is not None and config.tokenizer_type != "bpe":
            raise RecipeError(f"bpe_dropout needs tokenizer_type 'bpe'; got {config.tokenizer_type!r} (use subword_alpha)")
    if not 0.0 <= config.source_word_dropout < 1.0:
        raise RecipeError(f"source_word_dropout must be in [0, 1) (0: off); got {config.source_word_dropout}")
    if config.test_bootstrap is not None and config.test_bootstrap < 2:
        raise RecipeError(f"test_bootstrap must be >= 2 resamples (1000 is usual) or null (no interval); got {config.test_bootstrap}")
    if not config.rdrop_alpha >= 0:
        raise RecipeError(f"rdrop_alpha must be >= 0 (0: no R-Drop); got {config.rdrop_alpha}")
    if config.length_penalty != 1.0 and config.test_num_beams == 1:
        raise RecipeError(f"length_penalty ({config.length_penalty}) applies to beam search only; it needs test_num_beams > 1")
    # model_config: every key must be a field of the family's config class (a misspelt key would
    # otherwise be stored and ignored), and the values must pass the class's own checks, before
    # minutes go into loading data.
    config_cls = _model_classes(config.model_family)[0]
    fields = [n for n in getattr(config_cls, "__dataclass_fields__", {}) if not n.startswith("_")]
    for key in config.model_config:
        if fields and key not in fields:
            close = difflib.get_close_matches(key, fields, n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
            raise RecipeError(f"model_config has unknown key {key!r} for {config_cls.__name__}{hint}")
    try:
        config_cls(**config.model_config)
    except (ValueError, TypeError) as err:
        raise RecipeError(f"model_config: {err}") from None


def _model_classes(family: str):
    """``(config class, model class)`` of ``family`` ("rnn" or "transformer")."""
    from .. import (
        RNNSeq2SeqConfig,
        RNNSeq2SeqForConditionalGeneration,
        TransformerSeq2SeqConfig,
        TransformerSeq2SeqForConditionalGeneration,
    )

    return {
        "rnn": (RNNSeq2SeqConfig, RNNSeq2SeqForConditionalGeneration),
        "transformer": (TransformerSeq2SeqConfig, TransformerSeq2SeqForConditionalGeneration),
    }[family]


# ---------------------------------------------------------------------------------------------
# Training state that is not in the model/optimizer/scheduler: saved with every checkpoint
# ---------------------------------------------------------------------------------------------
@dataclass
class TrainerState:
    step: int = 0  # optimizer updates done
    epoch: int = 0  # epoch of the batch stream
    batch_in_epoch: int = 0  # micro-batches of that epoch this rank has consumed
    batches_per_epoch: int = 0  # micro-batches per epoch on one rank
    wall_time_s: float = 0.0  # time in the training loop, validation and checkpoints included (all sessions)
    train_time_s: float = 0.0  # time in optimizer updates only: the denominator of tokens/s
    target_tokens: int = 0  # non-padding target tokens trained on, all ranks together
    validation: list = field(default_factory=list)  # one dict per validation
    train_loss: list = field(default_factory=list)  # [step, mean smoothed loss per target token] per log
    best: list = field(default_factory=list)  # [[score, step], ...] of the weights kept in best/, best first
    bad_validations: int = 0  # validations since the last improvement (early stopping)

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)

    @property
    def epochs(self) -> float:
        return self.epoch + self.batch_in_epoch / max(1, self.batches_per_epoch)


# ---------------------------------------------------------------------------------------------
# Data: pre-tokenized pairs, token-budget batches, resumable epoch stream
# ---------------------------------------------------------------------------------------------
class PairDataset(torch.utils.data.Dataset):
    """Tokenized pairs held as Python lists (no Arrow row access per example in the hot loop)."""

    def __init__(self, input_ids: list[list[int]], labels: list[list[int]]):
        self.input_ids, self.labels = input_ids, labels

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.input_ids[i], "labels": self.labels[i], "id": i}

    def lengths(self) -> np.ndarray:
        """(num_pairs, 2): source and target length of each pair, in tokens."""
        return np.array([[len(s), len(t)] for s, t in zip(self.input_ids, self.labels)], dtype=np.int64).reshape(-1, 2)


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
    origin = f"the tokenizer from tokenizer_path {config.tokenizer_path}" if config.tokenizer_path else "the run's tokenizer"
    if config.subword_alpha is not None and kind != "Unigram":
        raise RecipeError(f"subword_alpha samples unigram segmentations, but {origin} is {kind}; use bpe_dropout for BPE")
    if config.bpe_dropout is not None and kind != "BPE":
        raise RecipeError(f"bpe_dropout needs a BPE tokenizer, but {origin} is {kind}; use subword_alpha for Unigram")
    subword = SubwordSampler(
        tokenizer, alpha=config.subword_alpha, nbest_size=config.subword_nbest_size, dropout=config.bpe_dropout
    )
    # the texts live on the main process only: it alone samples, the other ranks receive the ids
    sources, targets = (train_split["source"][:], train_split["target"][:]) if accelerator.is_main_process else (None, None)
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
            logger.info("epoch %d: sampled segmentations, %.2fx the tokens of the best ones (%d sides over the "
                        "length limit kept theirs)", epoch, tokens / max(1, best_tokens), kept)
        if accelerator.num_processes > 1:
            broadcast_object_list(payload, from_process=0)
        train_set.input_ids, train_set.labels = payload
        done["epoch"] = epoch
        return True

    return resample


class Collate:
    """The data layer's padding plus what the loop needs: ``decoder_input_ids`` (labels shifted
    right behind ``decoder_start_token_id``, so the model does not compute its own loss) and
    ``id`` (batch,), the dataset indices of the examples.

    Returns ``input_ids``/``attention_mask`` (batch, src_len), ``labels``/``decoder_input_ids``
    (batch, tgt_len), labels -100 on padding.
    """

    def __init__(self, pad_token_id: int, decoder_start_token_id: int):
        from ..data.batching import Seq2SeqCollator

        self.pad, self.start = pad_token_id, decoder_start_token_id
        self.collator = Seq2SeqCollator(pad_token_id=pad_token_id)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        batch = self.collator(features)
        labels = batch["labels"]
        decoder_input_ids = labels.new_full(labels.shape, self.pad)
        decoder_input_ids[:, 0] = self.start
        decoder_input_ids[:, 1:] = labels[:, :-1].masked_fill(labels[:, :-1] == -100, self.pad)
        batch["decoder_input_ids"] = decoder_input_ids
        batch["id"] = torch.tensor([f["id"] for f in features])
        return batch


def micro_batches(loader, sampler, state: TrainerState, device, before_epoch=None):
    """Endless stream of this rank's micro-batches, epoch after epoch, on ``device``.

    ``state.epoch`` / ``state.batch_in_epoch`` count what was consumed (not what a loader worker
    prefetched), so a checkpoint records the exact position to resume from; the sampler skips
    the consumed batches as index lists, never collating them. ``before_epoch(epoch)``, if
    given, runs before each epoch's batches are drawn (subword resampling).
    """
    while True:
        if before_epoch is not None:
            before_epoch(state.epoch)
        sampler.set_epoch(state.epoch, start_batch=state.batch_in_epoch)
        for batch in loader:
            state.batch_in_epoch += 1
            yield {k: v if k == "id" else v.to(device, non_blocking=True) for k, v in batch.items()}
        state.epoch += 1
        state.batch_in_epoch = 0


# ---------------------------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------------------------
def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Label-smoothed cross-entropy *summed* over the target tokens (labels != -100).

    Args:
        logits: (batch, tgt_len, vocab_size).
        labels: (batch, tgt_len), -100 on padding.
        label_smoothing: epsilon; the smoothing mass is spread over the whole vocabulary.

    Returns:
        A scalar tensor (float32). Divide by the token count of the *whole* update yourself.
    """
    # The model file's one-pass loss: the value of F.cross_entropy(..., label_smoothing=...), but its
    # backward keeps no extra (tokens, vocab_size) tensors (measured 303 -> 251 ms on 3,700 x 8,000
    # logits, benchmarks/README.md), and on a CPU it works through cache-sized blocks of rows
    # (benchmarks/probe_loss_blocks.py). It works on any family's logits.
    return label_smoothed_cross_entropy(logits.flatten(0, 1), labels.flatten(), label_smoothing, reduction="sum")


def source_word_dropout(input_ids: torch.Tensor, attention_mask: torch.Tensor, p: float, unk_token_id: int,
                        keep_ids: tuple[int, ...] = ()) -> torch.Tensor:
    """Word dropout on the source: each real source token becomes ``unk_token_id`` with probability p.

    Sennrich & Zhang 2019 (Revisiting Low-Resource Neural Machine Translation) drop whole words
    to regularise small-data NMT, after Gal & Ghahramani 2016's word-embedding dropout; here the
    unit is the subword and a dropped one reads as ``<unk>`` (one learned "missing" vector, the
    same for both model families). Padding (``attention_mask`` 0) and ``keep_ids`` (``</s>``)
    are never dropped. The draw uses torch's global generator, so a seeded run repeats it and a
    resumed one continues it.

    Args:
        input_ids: (batch, src_len) source token ids.
        attention_mask: (batch, src_len), 1 on real tokens, 0 on padding.
        p: drop probability in [0, 1).
        unk_token_id: the id that replaces a dropped token.
        keep_ids: ids never dropped.

    Returns:
        A new (batch, src_len) tensor; ``input_ids`` is not modified. p = 0 returns ``input_ids`` itself.
    """
    if p == 0.0:
        return input_ids
    drop = (torch.rand(input_ids.shape, device=input_ids.device) < p) & attention_mask.bool()
    for token_id in keep_ids:
        drop &= input_ids != token_id
    return input_ids.masked_fill(drop, unk_token_id)


def symmetric_kl_sum(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) + KL(q || p) summed over positions: twice the R-Drop regulariser L_KL of
    Liang et al. 2021, eq. 2 (eq. 3 adds alpha x L_KL to both passes' NLL), computed as the single
    sum  Σ_v (p_v − q_v)(log p_v − log q_v)  per position.

    Args:
        logits_p, logits_q: (tokens, vocab_size) logits of the same positions from two forward
            passes; half-precision logits are upcast to float32. Gradients reach both.

    Returns:
        A float32 scalar (0 for zero positions).
    """
    log_p = torch.log_softmax(logits_p.float(), dim=-1)
    log_q = torch.log_softmax(logits_q.float(), dim=-1)
    return ((log_p.exp() - log_q.exp()) * (log_p - log_q)).sum()


def optimizer_update(accelerator, model, optimizer, scheduler, micro: list[dict], label_smoothing: float, max_grad_norm: float,
                     rdrop_alpha: float = 0.0):
    """One optimizer update over this rank's micro-batches, normalised by the global token count.

    Args:
        micro: this rank's micro-batches (dicts with ``input_ids``, ``attention_mask``,
            ``decoder_input_ids``, ``labels``), all already on the device.
        label_smoothing: epsilon of the training loss.
        max_grad_norm: clip the global gradient norm to this (0: no clipping).
        rdrop_alpha: R-Drop weight (0: off). Each micro-batch then runs as two copies in one
            forward pass (different dropout masks); the loss is both copies' cross-entropy plus
            ``rdrop_alpha / 2`` x `symmetric_kl_sum` of their predictions, and the update is
            normalised by the tokens of both copies.

    Returns:
        ``(loss_sum, num_tokens)``: this rank's summed smoothed cross-entropy (a detached scalar
        tensor; with R-Drop over both copies, without the KL term) and the target tokens of the
        whole update over all ranks (a scalar tensor; with R-Drop both copies count). Nothing is
        synchronised to the host.
    """
    world = accelerator.num_processes
    copies = 2 if rdrop_alpha > 0 else 1
    num_tokens = copies * sum((mb["labels"] != -100).sum() for mb in micro)
    if world > 1:
        num_tokens = accelerator.reduce(num_tokens, reduction="sum")
    update_loss = torch.zeros((), device=accelerator.device)
    for i, mb in enumerate(micro):
        sync = i == len(micro) - 1  # DDP all-reduces the gradients on the last micro-batch only
        with contextlib.nullcontext() if sync else accelerator.no_sync(model):
            if copies == 2:
                mb = {k: torch.cat([v, v]) for k, v in mb.items()}
            out = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"],
                        decoder_input_ids=mb["decoder_input_ids"], use_cache=False)
            loss_sum = token_loss_sum(out.logits, mb["labels"], label_smoothing)
            coverage_penalty = getattr(out, "coverage_penalty", None)
            if coverage_penalty is not None:
                # RNN coverage (See et al. 2017, eq. 12): the summed penalty of the real target
                # tokens, weighted like the model's own loss does it.
                weight = accelerator.unwrap_model(model).config.coverage_loss_weight
                loss_sum = loss_sum + weight * coverage_penalty[mb["labels"] != -100].sum()
            objective = loss_sum
            if copies == 2:
                first, second = out.logits.chunk(2)
                keep = mb["labels"].chunk(2)[0] != -100
                objective = loss_sum + 0.5 * rdrop_alpha * symmetric_kl_sum(first[keep], second[keep])
            # DDP averages gradients over ranks; scaling by the world size turns that average into
            # a sum, so the update is d(summed loss)/d(weights) / (global target tokens).
            accelerator.backward(objective * (world / num_tokens))
        update_loss += loss_sum.detach()
    if max_grad_norm > 0:
        accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    if not accelerator.optimizer_step_was_skipped:  # an fp16 overflow skips the step: keep the schedule
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return update_loss, num_tokens


# ---------------------------------------------------------------------------------------------
# Building blocks: accelerator, data, model
# ---------------------------------------------------------------------------------------------
def build_accelerator(config: TrainConfig, output_dir: Path, mixed_precision: str | None = None) -> Accelerator:
    """The Accelerator of this run. ``accelerate launch --multi_gpu --num_processes N`` on a
    machine without CUDA starts N ranks that form one gloo group only if the Accelerator is built
    with ``cpu=True``; without it each rank would silently train its own copy of the model.
    ``mixed_precision`` is the resolved choice (never ``"auto"``); None: ``config.mixed_precision``."""
    multi_process = int(os.environ.get("WORLD_SIZE", "1")) > 1
    cpu = multi_process and not torch.cuda.is_available()
    return Accelerator(
        cpu=cpu,
        mixed_precision=mixed_precision or config.mixed_precision,
        log_with=None if config.log_with == "none" else config.log_with,
        project_dir=str(output_dir),
    )


def load_data(config: TrainConfig, accelerator: Accelerator, output_dir: Path):
    """Corpus, tokenizer (trained once on the main process, then read by every rank) and the
    tokenized corpus; returns ``(tokenized DatasetDict, CorpusInfo, tokenizer)``.

    Training pairs longer than ``max_source_length`` / ``max_target_length`` are dropped;
    validation and test sources are truncated (every sentence is still scored).
    """
    from transformers import PreTrainedTokenizerFast

    from ..data.batching import tokenize_dataset
    from ..data.corpora import load_corpus
    from ..data.tokenization import train_tokenizer

    import datasets

    datasets.disable_progress_bars()  # seconds of work per split: the log states what matters
    with accelerator.main_process_first():  # the Bible corpus prepares a cached copy once
        raw, info = load_corpus(config.corpus, filters=config.corpus_filters or None, return_info=True)
    if config.max_train_examples is not None:
        raw["train"] = raw["train"].select(range(min(config.max_train_examples, len(raw["train"]))))
    # The run's tokenizer lives in model/ from the start, so a resumed run reads it back rather
    # than training a new one (subword training is not bitwise reproducible across runs).
    tokenizer_dir = output_dir / "model"
    if accelerator.is_main_process and not (tokenizer_dir / "tokenizer.json").exists():
        if config.tokenizer_path:
            tokenizer = PreTrainedTokenizerFast.from_pretrained(config.tokenizer_path)
        else:
            tokenizer = train_tokenizer(raw["train"], config.vocab_size, model_type=config.tokenizer_type)
        tokenizer.save_pretrained(tokenizer_dir)
    accelerator.wait_for_everyone()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    tokenized = tokenize_dataset(raw, tokenizer, config.max_source_length, config.max_target_length, overlong="filter")
    return tokenized, info, tokenizer


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
    ``"auto"`` (measured on a throw-away model of the run's shape, or read from the cache), None
    for any other value (used as it is)."""
    if config.mixed_precision != "auto":
        return None
    from .precision import resolve_mixed_precision

    config_cls, model_cls = _model_classes(config.model_family)

    def throwaway_model():
        return model_cls(config_cls(vocab_size=config.vocab_size, **config.model_config))

    return resolve_mixed_precision(config.model_family, config.model_config, config.vocab_size, config.max_tokens,
                                   build_model=throwaway_model)


def build_model(config: TrainConfig, tokenizer):
    config_cls, model_cls = _model_classes(config.model_family)
    reserved = {"vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "label_smoothing"}
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


# ---------------------------------------------------------------------------------------------
# Validation, test and attention plots
# ---------------------------------------------------------------------------------------------
_SCORE_KEYS = ("bleu", "bleu_lowercase", "chrf", "bleu_signature", "bleu_lowercase_signature", "chrf_signature")
_CI_KEYS = ("bleu_ci95", "bleu_lowercase_ci95", "chrf_ci95")


def _eval_batches(dataset, tokenizer, config: TrainConfig, max_examples: int | None, accelerator):
    """This rank's share of length-sorted evaluation batches: (example indices, batch on device)."""
    n = len(dataset) if max_examples is None else min(max_examples, len(dataset))
    src, tgt = dataset["input_ids"][:n], dataset["labels"][:n]
    order = sorted(range(n), key=lambda i: len(src[i]))
    chunks = [order[i : i + config.eval_batch_size] for i in range(0, n, config.eval_batch_size)]
    collate = Collate(tokenizer.pad_token_id, tokenizer.bos_token_id)
    for chunk in chunks[accelerator.process_index :: accelerator.num_processes]:
        batch = collate([{"input_ids": src[i], "labels": tgt[i], "id": i} for i in chunk])
        yield chunk, {k: v.to(accelerator.device) for k, v in batch.items()}


@torch.no_grad()
def evaluate(model, dataset, tokenizer, config: TrainConfig, accelerator, num_beams: int, max_examples, target_lang,
             n_bootstrap: int = 1) -> dict:
    """Teacher-forced loss / perplexity and beam-search BLEU / chrF on (a prefix of) ``dataset``.

    The work is split over ranks by batch; every rank returns the same numbers. ``loss`` is the
    mean negative log-likelihood per target token (no label smoothing), ``perplexity`` its exp.
    ``n_bootstrap`` > 1 adds each score's 95% confidence half-width (`corpus_scores`).
    """
    was_training = model.training
    model.eval()
    nll, tokens, translations = torch.zeros((), device=accelerator.device), torch.zeros((), device=accelerator.device), []
    for ids, batch in _eval_batches(dataset, tokenizer, config, max_examples, accelerator):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=batch["decoder_input_ids"]).logits
        nll += token_loss_sum(logits, batch["labels"], 0.0)
        tokens += (batch["labels"] != -100).sum()
        out = model.generate(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=num_beams, max_new_tokens=config.max_target_length
        )
        translations.extend(zip(ids, tokenizer.batch_decode(out, skip_special_tokens=True)))
    totals = accelerator.reduce(torch.stack([nll, tokens]), reduction="sum").tolist()
    translations = sorted(gather_object(translations)) if accelerator.num_processes > 1 else sorted(translations)
    hyps = [t for _, t in translations]
    references = dataset["target"][:]  # the raw strings, not our tokenizer's round trip
    refs = [references[i] for i, _ in translations]
    model.train(was_training)
    loss = totals[0] / max(1.0, totals[1])
    return {"loss": loss, "perplexity": math.exp(min(loss, 100.0)), **corpus_scores(hyps, refs, target_lang, n_bootstrap), "hypotheses": hyps}


@torch.no_grad()
def plot_attention(model, tokenizer, sources: list[str], out_dir: Path, prefix: str, config: TrainConfig, device) -> None:
    """Translate each source greedily, re-read the output teacher-forced with
    ``output_attentions=True`` and write its cross-attention heat-maps as ``<prefix>_<i>.png``.

    Writes nothing for a model without cross-attention (the RNN with ``attention="none"``
    returns ``cross_attentions=None``)."""
    was_training = model.training
    model.eval()
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation not in (None, "eager"):  # SDPA never materialises the probabilities
        model.set_attn_implementation("eager")
    try:
        for i, text in enumerate(sources):
            enc = tokenizer([text], return_tensors="pt", truncation=True, max_length=config.max_source_length).to(device)
            hyp = model.generate(**enc, num_beams=1, max_new_tokens=config.max_target_length)[0]
            out = model(**enc, decoder_input_ids=hyp[None, :-1], output_attentions=True)
            if out.cross_attentions is None:  # nothing to draw
                return
            layers = [a[0].float().cpu().numpy() for a in out.cross_attentions]  # (num_heads, tgt_len, src_len)
            src_tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"][0].tolist())
            tgt_tokens = tokenizer.convert_ids_to_tokens(hyp[1:].tolist())
            plot_cross_attentions(layers, src_tokens, tgt_tokens, out_dir, f"{prefix}_{i}")
    finally:
        if implementation not in (None, "eager"):
            model.set_attn_implementation(implementation)
        model.train(was_training)


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------
def _step_dirs(root: Path) -> list[Path]:
    """``root/step_<N>`` folders, oldest first (temporary ``.tmp_*`` folders are ignored)."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := re.fullmatch(r"step_(\d+)", p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def _atomic_write(accelerator: Accelerator, final: Path, write) -> None:
    """Run ``write(tmp_dir)`` on every rank, then rename the folder to ``final`` on the main one.

    A crash while writing leaves only a ``.tmp_*`` folder; the previous checkpoints stay intact.
    """
    tmp = final.parent / f".tmp_{final.name}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    write(tmp)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        give_ordinary_modes(tmp)  # safetensors writes 0600
        if final.exists():  # the same step written again: drop the old copy only now
            shutil.rmtree(final)
        os.replace(tmp, final)
    accelerator.wait_for_everyone()


def save_checkpoint(accelerator: Accelerator, root: Path, step: int, keep: int) -> None:
    _atomic_write(accelerator, root / f"step_{step}", lambda tmp: accelerator.save_state(str(tmp)))
    if accelerator.is_main_process:
        for old in _step_dirs(root)[:-keep]:
            shutil.rmtree(old)


def update_best(accelerator, model, state: TrainerState, best_root: Path, score: float, higher_is_better: bool, k: int) -> None:
    """Keep the weights of this validation in ``best/step_<N>`` if it is among the best ``k``."""
    if k < 1:
        return
    # Best score first; among equal scores the later (longer trained) weights win.
    ranked = sorted(state.best + [[score, state.step]], key=lambda e: (-e[0] if higher_is_better else e[0], -e[1]))
    kept, dropped = ranked[:k], ranked[k:]
    if [score, state.step] in kept:
        _atomic_write(accelerator, best_root / f"step_{state.step}", lambda tmp: accelerator.save_model(model, str(tmp)))
    if accelerator.is_main_process:
        for _, step in dropped:
            shutil.rmtree(best_root / f"step_{step}", ignore_errors=True)
    state.best = kept


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------
class _QuietCheckpointNotices(logging.Filter):
    """safetensors stores a tied matrix once; Accelerate warns about it on every save."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Removed shared tensor" not in record.getMessage()


def _setup_logging(is_main: bool) -> None:
    logger.setLevel(logging.INFO if is_main else logging.WARNING)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
    logging.getLogger("accelerate").setLevel(logging.WARNING)
    import transformers

    transformers.utils.logging.disable_progress_bar()  # "Writing model shards": one file, a bar per save
    for name in ("accelerate.utils.other", "accelerate.checkpointing", "accelerate.accelerator"):
        target = logging.getLogger(name)
        if not any(isinstance(f, _QuietCheckpointNotices) for f in target.filters):
            target.addFilter(_QuietCheckpointNotices())


def train(config: TrainConfig) -> Path:
    """Run a whole training (or resume one) and return the output folder.

    Writes ``model/``, ``metrics.json``, ``recipe.yaml``, ``plots/``, ``checkpoints/``, ``best/``
    and ``logs/`` under ``config.output_dir`` (docs/DESIGN.md). Safe to call in-process, several
    times; Accelerate keeps one state per process, so those calls must share ``mixed_precision``.

    Raises:
        RecipeError: invalid hyperparameters (the message names the field).
        FileExistsError: ``output_dir`` holds checkpoints and ``resume`` is off.
        FloatingPointError: the training loss became NaN or infinite (names the first bad update;
            the checkpoints written before it are kept).
    """
    validate_config(config)
    output_dir = Path(config.output_dir).resolve()
    ckpt_root, best_root, plots_dir = output_dir / "checkpoints", output_dir / "best", output_dir / "plots"
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    precision = resolve_precision(config)  # None unless mixed_precision is "auto"
    accelerator = build_accelerator(config, output_dir, precision.mixed_precision if precision else None)
    is_main = accelerator.is_main_process
    _setup_logging(is_main)
    world = accelerator.num_processes
    logger.info("world size %d, device %s, mixed precision %s", world, accelerator.device, accelerator.mixed_precision)
    if precision is not None:
        logger.info("mixed_precision auto -> %s: %s", precision.mixed_precision, precision.reason)
    if _step_dirs(ckpt_root) and not config.resume:
        raise FileExistsError(f"{ckpt_root} already holds checkpoints: pass --resume to continue the run or choose another output_dir")
    if is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        dump_recipe(config, output_dir / "recipe.yaml")
    set_seed(config.seed)

    # ---- data and model -----------------------------------------------------------------------
    from ..data.batching import TokenBudgetBatchSampler

    data, info, tokenizer = load_data(config, accelerator, output_dir)
    if config.source_word_dropout > 0 and tokenizer.unk_token_id is None:
        raise RecipeError(f"source_word_dropout replaces tokens by <unk>, but the tokenizer ({config.tokenizer_path}) has no unk_token; set source_word_dropout: 0")
    train_set = PairDataset(data["train"]["input_ids"][:], data["train"]["labels"][:])  # [:]: Column -> list
    # With subword sampling, the sampler and the step count of max_epochs start from the best
    # segmentation (deterministic, so a resumed run computes the same schedule); each epoch's
    # batches then follow that epoch's sampled lengths (before_epoch below).
    resample_segmentations = build_subword_resampling(config, data["train"], train_set, tokenizer, accelerator)
    sampler = TokenBudgetBatchSampler(
        train_set.lengths(),
        max_tokens=config.max_tokens,
        shuffle=True,
        seed=config.seed,
        num_replicas=world,
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
    state = TrainerState(batches_per_epoch=len(sampler))
    updates_per_epoch = max(1, state.batches_per_epoch // config.gradient_accumulation_steps)
    limits = [config.max_steps] if config.max_steps is not None else []
    if config.max_epochs is not None:
        limits.append(math.ceil(config.max_epochs * updates_per_epoch))
    total_steps = min(limits) if limits else None

    set_seed(config.seed)  # the same initial weights whatever the data loading consumed
    model = build_model(config, tokenizer)
    set_seed(config.seed, device_specific=True)  # dropout: a different stream on each rank
    optimizer = torch.optim.AdamW(
        optimizer_param_groups(model, config.weight_decay),
        lr=config.learning_rate,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_epsilon,
        weight_decay=config.weight_decay,
        # torch's fused AdamW runs on CPU too: 31 -> 9 ms per step for 6M parameters here.
        fused=accelerator.device.type in ("cuda", "cpu"),
    )
    higher_is_better = config.early_stopping_metric != "loss"
    plateau = PlateauDecay(config.plateau_factor, config.plateau_patience, higher_is_better)
    time_budget = TimeBudget(60 * config.max_time_minutes) if config.schedule == "linear_time" else None
    scheduler = build_scheduler(optimizer, config.schedule, config.warmup_steps, total_steps, plateau, time_budget)
    model, optimizer = accelerator.prepare(model, optimizer)
    # The scheduler is stepped once per update by us, not by Accelerate (whose wrapper steps it
    # once per process); it is checkpointed like the other states.
    accelerator.register_for_checkpointing(scheduler, plateau, state)
    # The clock is registered only for linear_time (older checkpoints do not have it); a run
    # switched to linear_time on --resume starts its decay at the resumed update.
    resume_from = _step_dirs(ckpt_root)[-1] if config.resume and _step_dirs(ckpt_root) else None
    clock_saved = resume_from is None or (resume_from / "custom_checkpoint_3.pkl").exists()
    if time_budget is not None and clock_saved:
        accelerator.register_for_checkpointing(time_budget)
    unwrapped = accelerator.unwrap_model(model)

    if resume_from is not None:
        last = resume_from
        accelerator.load_state(str(last))
        logger.info("resumed from %s (update %d, epoch %.2f)", last, state.step, state.epochs)
        if time_budget is not None and not clock_saved:
            accelerator.register_for_checkpointing(time_budget)  # saved from now on
            logger.info("schedule linear_time: %s has no time-budget state; the decay starts at update %d", last, state.step)
        if is_main:  # best/ folders written after that checkpoint belong to the lost future
            kept = {f"step_{s}" for _, s in state.best}
            for d in _step_dirs(best_root):
                if d.name not in kept:
                    shutil.rmtree(d)

    if config.log_with != "none":
        flat = {k: (json.dumps(v) if isinstance(v, dict) else v) for k, v in dataclasses.asdict(config).items()}
        accelerator.init_trackers("logs", config=flat)
    num_params = sum(p.numel() for p in unwrapped.parameters())
    logger.info("%s: %.2fM parameters, %d training pairs, %d micro-batches per epoch per rank",
                type(unwrapped).__name__, num_params / 1e6, len(train_set), state.batches_per_epoch)
    if total_steps is not None:
        work = f"{total_steps - state.step} updates to do ({(total_steps - state.step) / updates_per_epoch:.2f} epochs)"
        if precision is not None and precision.step_s is not None:
            work += f"; about {(total_steps - state.step) * precision.step_s / 60:.1f} min on this machine ({1000 * precision.step_s:.0f} ms a step measured)"
        logger.info(work)
    target_lang = info.target_lang
    plot_sources = data["validation"]["source"][: config.num_plot_sentences]  # fixed sentences
    dump = None
    if config.debug_dump_batches:
        (output_dir / "debug").mkdir(parents=True, exist_ok=True)
        dump = open(output_dir / "debug" / f"batches_rank{accelerator.process_index}.jsonl", "a")

    def validate_and_keep() -> bool:
        """Validate, log, keep the best weights; returns True when early stopping says stop."""
        result = evaluate(unwrapped, data["validation"], tokenizer, config, accelerator, config.eval_num_beams, config.eval_max_examples, target_lang)
        record = {"step": state.step, **{k: result[k] for k in ("loss", "perplexity", "bleu", "chrf")}}
        state.validation.append(record)
        score = record[config.early_stopping_metric]
        previous = [v[config.early_stopping_metric] for v in state.validation[:-1]]
        improved = not previous or (score > max(previous) if higher_is_better else score < min(previous))
        state.bad_validations = 0 if improved else state.bad_validations + 1
        if config.schedule == "plateau":
            plateau.observe(score)
        update_best(accelerator, model, state, best_root, score, higher_is_better, config.keep_best_k)
        if is_main:
            accelerator.log({f"valid/{k}": v for k, v in record.items() if k != "step"}, step=state.step)
            tqdm.write(f"validation @ {state.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in record.items() if k != "step"))
            if config.num_plot_sentences:
                plot_attention(unwrapped, tokenizer, plot_sources, plots_dir, f"attention_val_step{state.step}", config, accelerator.device)
        accelerator.wait_for_everyone()
        patience = config.early_stopping_patience
        return patience is not None and state.bad_validations >= patience

    # ---- training loop --------------------------------------------------------------------------
    model.train()
    before_epoch = None
    if resample_segmentations is not None:

        def before_epoch(epoch: int) -> None:
            if resample_segmentations(epoch):
                sampler.set_lengths(train_set.lengths())
                state.batches_per_epoch = len(sampler.global_batches(epoch)) // world

    special_source_ids = tuple(i for i in (tokenizer.bos_token_id, tokenizer.eos_token_id) if i is not None)
    stream = micro_batches(loader, sampler, state, accelerator.device, before_epoch)
    device = accelerator.device
    loss_acc = torch.zeros((), device=device)  # summed smoothed loss since the last log (this rank)
    tokens_acc = torch.zeros((), device=device)  # target tokens since the last log (all ranks)
    first_bad = torch.full((), -1, dtype=torch.long, device=device)  # first update with a non-finite loss
    last_log_time = session_start = time.perf_counter()
    earlier_sessions_s = state.wall_time_s
    if time_budget is not None:  # warm-up 0 (or a resume after it): the decay starts now at the latest
        time_budget.observe(earlier_sessions_s, state.step, config.warmup_steps)
    # A terminal (or the main job relaying one: ATTENTION_SEQ2SEQ_PROGRESS=live) redraws the bar
    # twice a second; a log file gets a line per 30 s.
    live = sys.stderr.isatty() or os.environ.get("ATTENTION_SEQ2SEQ_PROGRESS") == "live"
    progress = tqdm(total=total_steps, initial=state.step, disable=not is_main, desc="train", unit="upd", dynamic_ncols=True,
                    mininterval=0.5 if live else 30.0)
    stop_reason = None
    first_step = state.step
    pace_step = first_step + max(1, min(200, (total_steps - first_step) // 10)) if total_steps is not None else None
    while stop_reason is None and (total_steps is None or state.step < total_steps):
        # One optimizer update: draw the micro-batches first, to know the global token count.
        micro = [next(stream) for _ in range(config.gradient_accumulation_steps)]
        for i, mb in enumerate(micro):
            ids = mb.pop("id")
            mb["input_ids"] = source_word_dropout(mb["input_ids"], mb["attention_mask"], config.source_word_dropout,
                                                  tokenizer.unk_token_id, keep_ids=special_source_ids)  # p = 0: unchanged
            if dump is not None:
                dump.write(json.dumps({"step": state.step, "micro": i, "ids": ids.tolist()}) + "\n")
        update_loss, num_tokens = optimizer_update(accelerator, model, optimizer, scheduler, micro, config.label_smoothing, config.max_grad_norm,
                                                   config.rdrop_alpha)
        first_bad = torch.where((first_bad < 0) & ~torch.isfinite(update_loss), state.step + 1, first_bad)
        state.step += 1
        loss_acc += update_loss
        tokens_acc += num_tokens
        progress.update(1)
        if is_main and total_steps is not None and state.step == pace_step:
            # The estimate made before training timed a synthetic step; this one is the real pace.
            pace = (state.step - first_step) / max(1e-9, time.perf_counter() - session_start)
            tqdm.write(f"after {state.step - first_step} updates: {pace:.2f} updates/s here, so the remaining "
                       f"{total_steps - state.step} take about {(total_steps - state.step) / pace / 60:.1f} min")

        # ---- logging (the only per-interval host sync), NaN check and time budget -------------
        evaluating = state.step % config.eval_every == 0 or state.step == total_steps
        saving = state.step % config.save_every == 0 or state.step == total_steps
        # One process checks the time budget after every update (no host sync needed); ranks of
        # a distributed run agree on it at the log interval, where they synchronise anyway.
        over_budget = False
        if world == 1 and config.max_time_minutes is not None:
            elapsed = earlier_sessions_s + time.perf_counter() - session_start
            over_budget = elapsed > 60 * config.max_time_minutes
            if time_budget is not None:  # one process: the schedule reads the clock every update
                time_budget.observe(elapsed, state.step, config.warmup_steps)
        # Several ranks agree on the clock at a log, so linear_time forces one at the end of warm-up.
        warmup_end = time_budget is not None and world > 1 and state.step == config.warmup_steps
        if state.step % config.log_every == 0 or evaluating or saving or over_budget or warmup_end:
            stats = torch.stack([loss_acc, tokens_acc / world, first_bad.float()])
            stats = accelerator.gather(stats[None]) if world > 1 else stats[None]
            loss_sum_all, tokens_all = stats[:, 0].sum().item(), stats[:, 1].sum().item()
            bad = [int(b) for b in stats[:, 2].tolist() if b >= 0]
            if bad:
                raise FloatingPointError(
                    f"training loss is not finite at update {min(bad)}; the last good checkpoint is kept in {ckpt_root}"
                )
            now = time.perf_counter()
            state.target_tokens += int(tokens_all)
            state.train_time_s += now - last_log_time
            state.wall_time_s = earlier_sessions_s + now - session_start
            last_loss = loss_sum_all / max(1.0, tokens_all)  # mean smoothed loss per target token
            state.train_loss.append([state.step, last_loss])
            logs = {"train/loss": last_loss, "train/lr": scheduler.get_last_lr()[0],
                    "train/target_tokens_per_s": tokens_all / max(1e-9, now - last_log_time), "train/epoch": state.epochs}
            if is_main:
                progress.set_postfix(loss=f"{last_loss:.3f}", lr=f"{logs['train/lr']:.2e}", tok_s=f"{logs['train/target_tokens_per_s']:.0f}")
                accelerator.log(logs, step=state.step)
            loss_acc.zero_()
            tokens_acc.zero_()
            last_log_time = now
            if config.max_time_minutes is not None:
                # Every rank must stop at the same update, and use the same learning rate: the
                # slowest rank's clock decides for all.
                elapsed = state.wall_time_s
                if world > 1:
                    elapsed = accelerator.gather(torch.tensor([elapsed], dtype=torch.float64, device=device)).max().item()
                    if time_budget is not None:
                        time_budget.observe(elapsed, state.step, config.warmup_steps)
                if elapsed > 60 * config.max_time_minutes:  # over budget: all ranks stop at this same update
                    stop_reason = "max_time_minutes"
                    evaluating = saving = True
        if evaluating and validate_and_keep():
            stop_reason = "early_stopping"
            saving = True
        if saving:
            save_checkpoint(accelerator, ckpt_root, state.step, config.keep_last_checkpoints)
        if evaluating or saving:
            last_log_time = time.perf_counter()  # tokens/s counts update time only
            state.wall_time_s = earlier_sessions_s + last_log_time - session_start
        if config.debug_crash_at_step is not None and state.step == config.debug_crash_at_step:
            raise RuntimeError(f"debug_crash_at_step: simulated crash after update {state.step}")
    progress.close()
    if dump is not None:
        dump.close()
        # Each rank's own weights after the last update: the tests check that DDP kept them equal.
        from safetensors.torch import save_file

        weights = {k: v.detach().cpu().clone().contiguous() for k, v in unwrapped.state_dict().items()}
        save_file(weights, str(output_dir / "debug" / f"weights_rank{accelerator.process_index}.safetensors"))
        give_ordinary_modes(output_dir / "debug" / f"weights_rank{accelerator.process_index}.safetensors")
    stop_reason = stop_reason or "max_steps/max_epochs"
    logger.info("training stopped (%s) after %d updates, %.2f epochs", stop_reason, state.step, state.epochs)

    # ---- final model: average / best / last weights ---------------------------------------------
    if [p.name for p in _step_dirs(ckpt_root)[-1:]] != [f"step_{state.step}"]:
        save_checkpoint(accelerator, ckpt_root, state.step, config.keep_last_checkpoints)
    if config.average_best_k:
        sources = [best_root / f"step_{s}" for _, s in state.best[: config.average_best_k]]
        final_desc = f"average of the best {len(sources)} validations (updates {[s for _, s in state.best[: config.average_best_k]]})"
    elif config.average_last_k:
        sources = _step_dirs(ckpt_root)[-config.average_last_k :]
        final_desc = f"average of the last {len(sources)} checkpoints ({[p.name for p in sources]})"
    elif state.best:
        sources = [best_root / f"step_{state.best[0][1]}"]
        final_desc = f"best validation {config.early_stopping_metric} (update {state.best[0][1]})"
    else:
        sources = [_step_dirs(ckpt_root)[-1]]
        final_desc = f"last update ({state.step})"
    load_averaged_weights(unwrapped, average_checkpoints(sources))
    logger.info("final model: %s", final_desc)
    if is_main:
        unwrapped.save_pretrained(output_dir / "model")
        tokenizer.save_pretrained(output_dir / "model")
    accelerator.wait_for_everyone()

    # ---- test set and the card's heat-map -------------------------------------------------------
    # Scored as users will load the saved model: float32, without the mixed-precision autocast
    # that Accelerate wrapped around forward for training (bf16 test scores differed by ~0.1 BLEU).
    unwrapped = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    n_bootstrap = config.test_bootstrap or 1
    test = evaluate(unwrapped, data["test"], tokenizer, config, accelerator, config.test_num_beams, config.test_max_examples, target_lang,
                    n_bootstrap)
    greedy = None
    if config.test_greedy and config.test_num_beams != 1:
        greedy = evaluate(unwrapped, data["test"], tokenizer, config, accelerator, 1, config.test_max_examples, target_lang, n_bootstrap)
    if is_main:
        plot_attention(unwrapped, tokenizer, data["test"]["source"][:1], plots_dir, "attention_test", config, accelerator.device)
        n_test = len(data["test"]) if config.test_max_examples is None else min(config.test_max_examples, len(data["test"]))
        metrics = {
            "model_family": unwrapped.config.model_type,
            "corpus": {k: v for k, v in info.to_dict().items() if k not in ("counts", "extra")},
            "train": {
                "steps": state.step,
                "epochs": round(state.epochs, 4),
                "wall_time_s": round(state.wall_time_s, 2),
                "train_time_s": round(state.train_time_s, 2),
                "target_tokens": state.target_tokens,
                "target_tokens_per_s": round(state.target_tokens / max(1e-9, state.train_time_s), 2),
                "final_train_loss": state.train_loss[-1][1] if state.train_loss else None,
                "loss_history": state.train_loss,
                "world_size": world,
                "num_threads": torch.get_num_threads(),  # torch intra-op threads of each process
                "mixed_precision": accelerator.mixed_precision,
                **({"mixed_precision_auto": precision.to_dict()} if precision is not None else {}),
                "stopped_by": stop_reason,
                "final_model": final_desc,
                "num_parameters": num_params,
            },
            "validation": state.validation,
            "test": {
                f"{config.corpus.split(':')[0]}-test{suffix}": {
                    "split": "test",
                    "num_sentences": n_test,
                    "num_beams": beams,
                    **({"length_penalty": config.length_penalty} if beams > 1 else {}),
                    **{k: result[k] for k in _SCORE_KEYS},
                    **{k: result[k] for k in _CI_KEYS if k in result},  # with test_bootstrap
                    "loss": result["loss"],
                }
                for suffix, beams, result in [("", config.test_num_beams, test), ("-greedy", 1, greedy)]
                if result is not None
            },
        }
        (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, ensure_ascii=False), encoding="utf-8")
        # The beam output behind the test scores, one line per test sentence, for inspection.
        (output_dir / "test_translations.txt").write_text("".join(h + "\n" for h in test["hypotheses"]), encoding="utf-8")
        logger.info("test (beam %d): BLEU %s, lower-cased BLEU %s, chrF %s (%s)", config.test_num_beams, format_score(test, "bleu"),
                    format_score(test, "bleu_lowercase"), format_score(test, "chrf"), test["bleu_signature"])
        if greedy is not None:
            (output_dir / "test_translations_greedy.txt").write_text("".join(h + "\n" for h in greedy["hypotheses"]), encoding="utf-8")
            logger.info("test (greedy): BLEU %s, lower-cased BLEU %s, chrF %s (%s)", format_score(greedy, "bleu"),
                        format_score(greedy, "bleu_lowercase"), format_score(greedy, "chrf"), greedy["bleu_signature"])
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return output_dir


def main(argv: list[str] | None = None) -> None:
    """Command-line entry: ``--recipe FILE`` plus ``--field value`` overrides (``--help`` lists them)."""
    try:
        config = parse_command_line(TrainConfig, argv, prog="python -m attention_seq2seq.training.train")
        validate_config(config)
    except RecipeError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    train(config)


if __name__ == "__main__":
    main()
