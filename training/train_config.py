"""The hyperparameters of a training run (:class:`TrainConfig`) and their checks.

A recipe (YAML or JSON) sets any field and ``--field value`` on the command line overrides it
(``training/config.py``); :func:`validate_config` rejects what cannot work before any data is read,
and :func:`check_paths` what the named files and folders cannot give, before the run folder exists.
"""

from __future__ import annotations

import dataclasses
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ..data.presets import PRESETS
from ..data.spec import CorpusError, CorpusSpec
from ..common.errors import did_you_mean
from ..modeling.registry import BY_NAME
from .config import RecipeError
from .schedules import SCHEDULES


@dataclass
class TrainConfig:
    # Old spellings recipes and command lines may still use -> the field's name now (the fine-tuning
    # command's names, as in transformers' example scripts).
    ALIASES: ClassVar[dict[str, str]] = {
        "max_train_examples": "max_train_samples",
        "eval_max_examples": "max_eval_samples",
        "test_max_examples": "max_test_samples",
    }
    # Removed fields -> what to do instead (a null value, as earlier runs' recipe.yaml holds, is ignored).
    REMOVED: ClassVar[dict[str, str]] = {
        "debug_crash_at_step": "to test --resume, stop the run (Ctrl-C, kill -9) and start it again with --resume",
    }

    # ---- model ---------------------------------------------------------------------------------
    model_family: str = "transformer"  # "rnn" or "transformer"
    model_config: dict = field(
        default_factory=dict
    )  # passed to RNNSeq2SeqConfig / TransformerSeq2SeqConfig (vocab size and special ids come from the tokenizer)
    # ---- data ----------------------------------------------------------------------------------
    corpus: str = "multi30k:../shared/data/multi30k:de-en"  # load_corpus spec (data/corpora.py); relative paths from the working directory
    corpus_filters: dict = field(
        default_factory=dict
    )  # CorpusFilters fields (dedup, max_length, max_ratio, ...), train split only
    max_train_samples: int | None = None  # use only the first N training pairs (quick runs, tests)
    tokenizer_type: str = "unigram"  # "unigram" (SentencePiece-style) or "bpe"; one joint vocabulary
    tokenizer_path: str | None = None  # a saved tokenizer folder to use instead of training one
    vocab_size: int = 8000  # subword vocabulary size, special tokens and byte pieces included
    tokenizer_train_pairs: int | None = (
        200_000  # train the tokenizer on at most this many training pairs, a seeded sample (SentencePiece's input_sentence_size; null: all)
    )
    no_cache: bool = (
        False  # prepare the corpus in output_dir/corpus_cache instead of the shared cache (docs/large-corpora.md)
    )
    max_source_length: int = 128  # tokens incl. </s>; longer training pairs are dropped, evaluation sources truncated
    max_target_length: int = 128  # tokens incl. </s>; also the generation limit (max_new_tokens)
    subword_alpha: float | None = (
        None  # unigram tokenizers: re-segment the training pairs every epoch, sampling segmentations with probability ∝ P(x)^alpha (subword regularization, Kudo 2018); smaller alpha: more, shorter pieces; at most 1 without subword_nbest_size; None: the best segmentation always
    )
    subword_nbest_size: int | None = (
        None  # with subword_alpha: sample among the n best segmentations (>= 2); None: among all of them
    )
    bpe_dropout: float | None = (
        None  # BPE tokenizers: re-segment the training pairs every epoch, skipping each merge with this probability (Provilkov et al. 2020)
    )
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
    max_time_minutes: float | None = (
        None  # wall-clock budget of the training loop, checked after every update (every log_every updates on several ranks)
    )
    # ---- validation ----------------------------------------------------------------------------
    eval_every: int = 1000  # validate every N updates (and at the end)
    max_eval_samples: int | None = 500  # validate on the first N validation pairs (None: all)
    eval_num_beams: int = 4  # beam size of the validation translations
    eval_batch_size: int = 32  # sentences per validation / test batch (as evaluate --batch-size: the same translations)
    early_stopping_metric: str = "bleu"  # "bleu", "chrf" or "loss"; also used by keep_best_k and "plateau"
    early_stopping_patience: int | None = None  # stop after N validations without improvement (None: never)
    keep_best_k: int = 1  # keep the weights of the k best validations in best/
    average_best_k: int = 0  # final model = mean of the best k kept weights (needs keep_best_k >= k)
    average_last_k: int = 0  # final model = mean of the last k checkpoints (needs keep_last_checkpoints >= k)
    num_plot_sentences: int = 2  # attention heat-maps of the first N validation sentences at each validation
    # ---- test ----------------------------------------------------------------------------------
    test_num_beams: int = 5  # beam size of the final test-set evaluation (also saved in generation_config)
    length_penalty: float = (
        1.0  # beam search scores log p / length^length_penalty (saved in generation_config); tune it on validation
    )
    max_test_samples: int | None = None  # evaluate on the first N test pairs (None: all)
    test_bootstrap: int | None = (
        None  # also each test score's 95% confidence interval from N bootstrap resamples of the test sentences (Koehn 2004; metrics.json keys bleu_ci95, bleu_lowercase_ci95, chrf_ci95); 1000 is usual, about a second; None: no interval
    )
    test_greedy: bool = False  # also score greedy decoding on the test set (metrics.json entry "<corpus>-test-greedy")
    # ---- checkpoints and output ----------------------------------------------------------------
    output_dir: str = "runs/train"  # the run folder (docs/DESIGN.md, "Training output folder")
    save_every: int = 1000  # accelerator.save_state every N updates (and at the end)
    keep_last_checkpoints: int = 2  # checkpoints/step_N folders kept (older ones are deleted)
    resume: bool = False  # continue from the newest checkpoint in output_dir/checkpoints
    # ---- system --------------------------------------------------------------------------------
    seed: int = 1234  # model init, dropout and data order
    num_threads: int | None = None  # torch intra-op CPU threads of each process (None: torch's default, one per core)
    mixed_precision: str | None = (
        None  # "auto" (bf16 on a GPU with bf16, a CPU with AMX or an AMD CPU with AVX512-BF16, else float32: the table of training/precision.py), "no", "fp16" (GPU) or "bf16" (GPU, or a CPU with AVX512-BF16/AMX); None: what `accelerate launch/config` says, else "no"
    )
    log_every: int = 50  # updates between progress/TensorBoard logs (each costs one host sync); with several ranks also how often linear_time reads the clock
    log_with: str = "tensorboard"  # "tensorboard" or "none"
    ddp_timeout: int = 1800  # several ranks: seconds a rank waits in a collective for the others before it stops with one line naming the wait (a rank that hangs rather than dies; a killed rank is noticed at once); 1800 is torch's and Trainer's default: lower it where a stuck machine must be found sooner, keep it above the longest step one rank takes alone (the final test decoding, the corpus build)
    # ---- debugging (used by the tests) ---------------------------------------------------------
    debug_dump_batches: bool = False  # each rank writes its micro-batches' example ids to debug/batches_rank<R>.jsonl


CHOICES = {
    "model_family": tuple(BY_NAME),  # modeling/registry.py
    "tokenizer_type": ("unigram", "bpe"),
    "schedule": SCHEDULES,
    "early_stopping_metric": ("bleu", "chrf", "loss"),
    "mixed_precision": (None, "auto", "no", "fp16", "bf16"),
    "log_with": ("tensorboard", "none"),
}


# The smallest vocabulary data/tokenization.py trains: 4 special tokens + 256 byte pieces + 40
# (train_tokenizer's own check; not imported from there, which would load datasets and tokenizers).
MIN_VOCAB_SIZE = 300
# Every length limit holds a sequence's tokens and its </s>: at least one subword and </s>.
MIN_LENGTH = 2
# numpy's seeds are 0 .. 2**32 - 1, and each rank seeds with seed + its rank (set_seed(device_specific=True)).
SEED_LIMIT = 2**32


def _check_finite(config: TrainConfig) -> None:
    """Every float field (and every float of model_config) is a finite number: NaN passes no
    comparison and infinity passes most of them (an infinite learning rate or weight decay trained
    to NaN weights)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            null = " (or null)" if "None" in str(f.type) else ""
            raise RecipeError(f"{f.name} must be a finite number{null}; got {value}")
    for key, value in config.model_config.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise RecipeError(f"model_config.{key} must be a finite number; got {value}")


def validate_config(config: TrainConfig) -> None:
    """Reject values that cannot work, naming the field and the valid values. Reads no file:
    :func:`check_paths` checks the files and folders the config names.

    Raises:
        RecipeError: a choice field outside its valid values, or inconsistent limits.
    """
    _check_finite(config)
    for name, valid in CHOICES.items():
        value = getattr(config, name)
        if value not in valid:
            raise RecipeError(f"{name} must be one of {', '.join(repr(v) for v in valid)}; got {value!r}")
    if config.max_steps is None and config.max_epochs is None and config.max_time_minutes is None:
        raise RecipeError("set at least one of max_steps, max_epochs, max_time_minutes")
    if not config.output_dir.strip():
        raise RecipeError(
            "--output_dir is empty: give a folder name for the run (e.g. runs/train); "
            "an empty one would train into the current folder"
        )
    try:  # the spec's grammar, kind and options; check_paths looks for its files
        CorpusSpec.coerce(config.corpus)
    except (CorpusError, TypeError) as err:
        raise RecipeError(f"corpus: {err}") from None
    world = max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))
    if not 0 <= config.seed <= SEED_LIMIT - world:
        ranks = f" (each of the {world} ranks seeds with seed + its rank)" if world > 1 else ""
        raise RecipeError(f"seed must be in [0, {SEED_LIMIT - world}] (numpy's seed range{ranks}); got {config.seed}")
    if config.tokenizer_path is not None and not config.tokenizer_path.strip():
        raise RecipeError("tokenizer_path is empty: give a saved tokenizer folder, or null to train one")
    if not config.tokenizer_path and config.vocab_size < MIN_VOCAB_SIZE:
        raise RecipeError(
            f"vocab_size must be >= {MIN_VOCAB_SIZE} (4 special tokens + 256 byte pieces + 40 subwords); "
            f"got {config.vocab_size}"
        )
    if config.tokenizer_path and config.vocab_size < 1:
        raise RecipeError(f"vocab_size must be >= 1 (unused with tokenizer_path); got {config.vocab_size}")
    for name in ("max_source_length", "max_target_length"):
        if getattr(config, name) < MIN_LENGTH:
            raise RecipeError(
                f"{name} must be >= {MIN_LENGTH} tokens (a subword and </s>; 128 is usual); got {getattr(config, name)}"
            )
    for name in (
        "max_tokens",
        "gradient_accumulation_steps",
        "eval_every",
        "save_every",
        "log_every",
        "keep_last_checkpoints",
        "ddp_timeout",
    ):
        if getattr(config, name) < 1:
            raise RecipeError(f"{name} must be >= 1; got {getattr(config, name)}")
    # the run's length: a limit that is set must allow at least one update
    for name in ("max_steps", "max_epochs", "max_time_minutes"):
        value = getattr(config, name)
        if value is not None and not value > 0:
            raise RecipeError(f"{name} must be > 0 (or null: no such limit); got {value}")
    # AdamW (Loshchilov & Hutter 2019): a step size and its terms that torch would refuse only
    # once the model and the data are loaded
    if not config.learning_rate > 0:
        raise RecipeError(f"learning_rate must be > 0; got {config.learning_rate}")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(config, name) < 1.0:
            raise RecipeError(f"{name} must be in [0, 1); got {getattr(config, name)}")
    if not config.adam_epsilon > 0:  # Adam divides by sqrt(v) + epsilon: 0 divides by zero
        raise RecipeError(f"adam_epsilon must be > 0 (1e-8 is usual); got {config.adam_epsilon}")
    for name in ("weight_decay", "max_grad_norm", "warmup_steps"):
        if not getattr(config, name) >= 0:
            raise RecipeError(f"{name} must be >= 0; got {getattr(config, name)}")
    if not 0.0 <= config.label_smoothing < 1.0:
        raise RecipeError(f"label_smoothing must be in [0, 1) (0: plain cross-entropy); got {config.label_smoothing}")
    if config.num_threads is not None and config.num_threads < 1:
        raise RecipeError(f"num_threads must be >= 1 or null (torch's default); got {config.num_threads}")
    if config.tokenizer_train_pairs is not None and config.tokenizer_train_pairs < 1:
        raise RecipeError(
            f"tokenizer_train_pairs must be >= 1 or null (all training pairs); got {config.tokenizer_train_pairs}"
        )
    if config.schedule == "linear_time" and not (config.max_time_minutes and config.max_time_minutes > 0):
        raise RecipeError(
            f"schedule 'linear_time' decays to 0 at the end of the time budget: set max_time_minutes > 0; got {config.max_time_minutes}"
        )
    if config.schedule == "linear" and config.max_steps is None and config.max_epochs is None:
        raise RecipeError(
            "schedule 'linear' decays to 0 at max_steps (or max_epochs): set one, or use 'linear_time' with max_time_minutes"
        )
    if config.average_best_k > config.keep_best_k:
        raise RecipeError(
            f"average_best_k ({config.average_best_k}) needs keep_best_k >= it; got keep_best_k={config.keep_best_k}"
        )
    if config.average_last_k > config.keep_last_checkpoints:
        raise RecipeError(
            f"average_last_k ({config.average_last_k}) needs keep_last_checkpoints >= it; got {config.keep_last_checkpoints}"
        )
    if config.average_best_k and config.average_last_k:
        raise RecipeError("set average_best_k or average_last_k, not both")
    if config.subword_alpha is not None and not config.subword_alpha > 0:
        raise RecipeError(f"subword_alpha must be > 0 (or null: no sampling); got {config.subword_alpha}")
    if config.subword_alpha is not None and config.subword_nbest_size is None and config.subword_alpha > 1:
        raise RecipeError(
            f"subword_alpha above 1 needs subword_nbest_size (sampling over every segmentation takes alpha <= 1); got {config.subword_alpha}"
        )
    if config.subword_nbest_size is not None and (config.subword_alpha is None or config.subword_nbest_size < 2):
        raise RecipeError(
            f"subword_nbest_size needs subword_alpha and must be >= 2 (or null: every segmentation); got {config.subword_nbest_size}"
        )
    if config.bpe_dropout is not None and not 0.0 < config.bpe_dropout < 1.0:
        raise RecipeError(f"bpe_dropout must be in (0, 1) (or null: no dropout); got {config.bpe_dropout}")
    if config.subword_alpha is not None and config.bpe_dropout is not None:
        raise RecipeError("set subword_alpha (unigram tokenizers) or bpe_dropout (BPE tokenizers), not both")
    if not config.tokenizer_path:  # a saved tokenizer's type is checked once it is loaded
        if config.subword_alpha is not None and config.tokenizer_type != "unigram":
            raise RecipeError(
                f"subword_alpha samples unigram segmentations; tokenizer_type is {config.tokenizer_type!r} (use bpe_dropout)"
            )
        if config.bpe_dropout is not None and config.tokenizer_type != "bpe":
            raise RecipeError(
                f"bpe_dropout needs tokenizer_type 'bpe'; got {config.tokenizer_type!r} (use subword_alpha)"
            )
    if not 0.0 <= config.source_word_dropout < 1.0:
        raise RecipeError(f"source_word_dropout must be in [0, 1) (0: off); got {config.source_word_dropout}")
    if config.test_bootstrap is not None and config.test_bootstrap < 2:
        raise RecipeError(
            f"test_bootstrap must be >= 2 resamples (1000 is usual) or null (no interval); got {config.test_bootstrap}"
        )
    if not config.rdrop_alpha >= 0:
        raise RecipeError(f"rdrop_alpha must be >= 0 (0: no R-Drop); got {config.rdrop_alpha}")
    if config.schedule == "plateau" and not 0.0 < config.plateau_factor < 1.0:
        raise RecipeError(f"plateau_factor must be in (0, 1); got {config.plateau_factor}")
    if config.schedule == "plateau" and config.plateau_patience < 1:
        raise RecipeError(f"plateau_patience must be >= 1; got {config.plateau_patience}")
    if config.length_penalty != 1.0 and config.test_num_beams == 1:
        raise RecipeError(
            f"length_penalty ({config.length_penalty}) applies to beam search only; it needs test_num_beams > 1"
        )
    # model_config: every key must be a field of the family's config class (a misspelt key would
    # otherwise be stored and ignored), and the values must pass the class's own checks, before
    # minutes go into loading data.
    config_cls = BY_NAME[config.model_family].config_cls()
    fields = [n for n in getattr(config_cls, "__dataclass_fields__", {}) if not n.startswith("_")]
    for key in config.model_config:
        if fields and key not in fields:
            raise RecipeError(
                f"model_config has unknown key {key!r} for {config_cls.__name__}{did_you_mean(key, fields)}"
            )
    try:
        model_config = config_cls(**config.model_config)
    except (ValueError, TypeError) as err:
        raise RecipeError(f"model_config: {err}") from None
    positions = getattr(model_config, "max_position_embeddings", None)  # the Transformer's position table
    for name in ("max_source_length", "max_target_length"):
        if isinstance(positions, int) and getattr(config, name) > positions:
            raise RecipeError(
                f"{name} ({getattr(config, name)}) is longer than the model's position table "
                f"(model_config.max_position_embeddings {positions}): lower it or raise max_position_embeddings"
            )


def _cwd_note(path: str) -> str:
    return "" if os.path.isabs(os.path.expanduser(path)) else f" (relative to the working directory {os.getcwd()})"


def _lookup(option: str, value: str, path: str | None = None) -> os.stat_result | None:
    """``os.stat`` of ``path`` (default ``value``, which the messages show); None: nothing there.
    A path the system refuses to look up (a link loop, a name too long, a file in the way) is one
    line with the system's reason."""
    path = value if path is None else path
    try:
        return os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise RecipeError(
                f"{option} {value} is a symbolic link to {os.readlink(path)}, which does not exist"
            ) from None
        return None
    except OSError as err:
        raise RecipeError(f"{option} {value}: {err.strerror or err}") from None


def _nearest_folder(path: str) -> str:
    """The nearest existing ancestor of ``path`` (``.`` for a relative path with none)."""
    parent = os.path.abspath(path)
    while not os.path.isdir(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    return parent


def _check_corpus_location(config: TrainConfig) -> None:
    """The corpus spec's local files exist (its syntax was checked by :func:`validate_config`).
    Nothing is read: a folder, a file or a file prefix is looked up by name only. ``hf`` ids are
    not looked up (the Hub answers for them), only ``hf`` locations written as paths."""
    spec = CorpusSpec.coerce(config.corpus)
    if spec.location is None:  # the Bible: SWORD modules, found by the loader
        return
    kind = spec.kind
    file_format = PRESETS[kind].format if kind in PRESETS else kind
    location = spec.location
    if file_format == "hf" and not location.startswith((".", "/", "~")):
        return
    found = _lookup(f"corpus {config.corpus}: location", location, os.path.expanduser(location))
    if found is not None and (stat.S_ISDIR(found.st_mode) or file_format != "text"):
        return
    where = _cwd_note(location)
    if file_format == "text":
        preset = PRESETS.get(kind)
        src = spec.source_lang or (preset.default_pair[0] if preset and preset.default_pair else None)
        prefix = os.path.expanduser(location)
        if src is not None and os.path.exists(f"{prefix}.{src}"):
            return
        if src is None and Path(prefix).parent.is_dir() and any(Path(prefix).parent.glob(f"{Path(prefix).name}.*")):
            return  # the loader names the missing language pair
        files = f" nor a prefix of {location}.{src}" if src else ""
        raise RecipeError(f"corpus {config.corpus}: location {location} is not a folder{files}{where}")
    raise RecipeError(f"corpus {config.corpus}: location {location} not found (a folder or a file){where}")


def check_paths(config: TrainConfig) -> Path:
    """Check the files and folders ``config`` names, reading none of them, and return the run
    folder's absolute path: ``output_dir`` is a folder or can become one, the corpus spec's local
    files exist, ``tokenizer_path`` is a saved tokenizer folder. Run it before anything is written.

    Raises:
        RecipeError: one line naming the option, the path and what would be valid.
    """
    value = config.output_dir
    if not value.strip():
        raise RecipeError("--output_dir is empty: give a folder name for the run (e.g. runs/train)")
    found = _lookup("--output_dir", value)
    if found is not None and not stat.S_ISDIR(found.st_mode):
        raise RecipeError(f"--output_dir {value} is a file; give a folder")
    if found is None:
        parent = _nearest_folder(value)
        if not os.access(parent, os.W_OK | os.X_OK):
            raise RecipeError(f"--output_dir {value}: cannot create it, {parent} is not writable; give another folder")
    _check_corpus_location(config)
    if config.tokenizer_path:
        path = config.tokenizer_path
        found = _lookup("tokenizer_path", path)
        if found is None:
            raise RecipeError(
                f"tokenizer_path {path} does not exist{_cwd_note(path)}: give a tokenizer folder saved by "
                "save_pretrained (a run's model/), or null to train one"
            )
        if not stat.S_ISDIR(found.st_mode):
            raise RecipeError(f"tokenizer_path {path} is a file; give the folder holding its tokenizer.json")
        if not os.path.isfile(os.path.join(path, "tokenizer.json")):
            raise RecipeError(
                f"tokenizer_path {path} holds no tokenizer.json: give a tokenizer folder saved by save_pretrained "
                "(a run's model/)"
            )
    return Path(os.path.realpath(value))
