"""Reading hyperparameters: recipe files (YAML or JSON) and command-line overrides.

The training script's dataclass, ``TrainConfig``, lives in ``train_config.py``; the fine-tuning
run's, ``FinetuneConfig``, at the end of this file. The helpers here work on any flat dataclass
whose fields have simple types (``int``, ``float``, ``str``, ``bool``, optional forms of these,
and ``dict``).

Precedence, lowest first: the dataclass defaults, the recipe (``--recipe FILE``), then each
``--field value`` on the command line. A ``dict`` field is *merged* key by key, so
``--model_config.d_model 128`` (or ``--model_config '{"d_model": 128}'``) changes one entry of
the recipe's ``model_config`` and keeps the rest.

Relative paths inside a recipe (the corpus spec, ``output_dir``) are read like paths typed on
the command line: relative to the current working directory, not to the recipe file. The
shipped recipes are written for the repository root as working directory.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from ..common.errors import UserError, did_you_mean

T = TypeVar("T")


class RecipeError(UserError, ValueError):
    """A recipe or command line names an unknown field or gives a value of the wrong type."""


def canonical_name(cls: type, name: str) -> str:
    """The field ``name`` stands for: ``name`` itself, or the field an old spelling in
    ``cls.ALIASES`` was renamed to (``max_train_examples`` -> ``max_train_samples``)."""
    return getattr(cls, "ALIASES", {}).get(name, name)


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _base_types(tp: Any) -> tuple[list[type], bool]:
    """The concrete types a field accepts, and whether it accepts None."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        return [typing.get_origin(a) or a for a in args if a is not type(None)], type(None) in args
    return [origin or tp], False


def coerce(name: str, value: Any, tp: Any) -> Any:
    """Check (and where lossless, convert) ``value`` for field ``name`` of type ``tp``.

    Strings from the command line are parsed as YAML scalars first (``1e-3`` → float, ``true`` →
    bool, ``null`` → None, ``{a: 1}`` → dict).

    Raises:
        RecipeError: the value does not fit the field's type (the message names the field).
    """
    allowed, nullable = _base_types(tp)
    if isinstance(value, str) and str not in allowed:
        text, value = value, yaml.safe_load(value)
        if isinstance(value, str) and float in allowed:  # YAML 1.1 reads "5e-4" as a string
            try:
                value = float(text)
            except ValueError:
                pass
    if value is None:
        if nullable:
            return None
        raise RecipeError(f"field {name!r} may not be null")
    for t in allowed:
        if t is bool:
            if isinstance(value, bool):
                return value
        elif t is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
        elif t is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        elif t is str:
            if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                return str(value)
        elif t is dict:
            if isinstance(value, dict):
                return dict(value)
        elif isinstance(value, t):
            return value
    names = " or ".join(getattr(t, "__name__", str(t)) for t in allowed) + (" or null" if nullable else "")
    hint = ""
    if isinstance(value, bool) and str in allowed:  # YAML 1.1: unquoted no/off/yes/on are booleans
        hint = f' (YAML reads an unquoted no, off, yes or on as a boolean: quote it, e.g. {name}: "no")'
    raise RecipeError(f"field {name!r} must be {names}; got {value!r}{hint}")


def config_from_dict(cls: type[T], values: dict[str, Any], base: T | None = None) -> T:
    """Build dataclass ``cls`` from ``values`` on top of ``base`` (or the defaults).

    Dict fields are merged into the base's dict, other fields replace it.

    Raises:
        RecipeError: unknown field (with the closest valid names) or a value of the wrong type.
    """
    field_types = _field_types(cls)
    current = dataclasses.asdict(base) if base is not None else {}
    for name, value in values.items():
        name = canonical_name(cls, name)
        if name in getattr(cls, "REMOVED", {}):
            if value is None:  # the default, as an earlier run's recipe.yaml records it
                continue
            raise RecipeError(f"field {name!r} was removed: {cls.REMOVED[name]}")
        if name not in field_types:
            raise RecipeError(
                f"unknown field {name!r}{did_you_mean(name, list(field_types))}; valid fields: {', '.join(field_types)}"
            )
        value = coerce(name, value, field_types[name])
        if isinstance(value, dict) and isinstance(current.get(name), dict):
            value = {**current[name], **value}
        current[name] = value
    return cls(**current)


def load_recipe(path: str | Path) -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or JSON (``.json``) recipe into a dict.

    Raises:
        RecipeError: no such file ("recipe not found: PATH"; the command line prints it as one
            line, also under ``accelerate launch``), or the file is not a mapping of field names
            to values.
    """
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe not found: {path}" + (" (a folder)" if path.is_dir() else ""))
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[: err.start].count(b"\n") + 1
        raise RecipeError(
            f"--recipe {path} line {line}: not UTF-8 text; a recipe is a YAML or JSON text file, saved as UTF-8"
        ) from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as err:
        raise RecipeError(f"--recipe {path} line {err.lineno} column {err.colno}: not valid JSON ({err.msg})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise RecipeError(f"--recipe {path}{where}: not valid YAML ({problem})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(f"--recipe {path} must be a mapping of field names to values; got {type(data).__name__}")
    return data


def field_comments(cls: type) -> dict[str, str]:
    """The trailing ``# comment`` of each field in the dataclass source (used for ``--help``)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    comments = {}
    for line in source.splitlines():
        m = re.match(r"\s+(\w+)\s*:[^#]*#\s*(.*)$", line)
        if m:
            comments[m.group(1)] = m.group(2).strip()
    return comments


def format_help(cls: type, prog: str) -> str:
    defaults = {
        f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
        for f in dataclasses.fields(cls)
    }
    comments = field_comments(cls)
    lines = [
        f"usage: {prog} [--recipe FILE] [--FIELD VALUE ...]",
        "",
        "Fields (recipe keys field_name, options --field-name or --field_name; "
        "dict fields also take --FIELD.KEY VALUE):",
    ]
    for name, default in defaults.items():
        lines.append(f"  --{name.replace('_', '-'):<28} default {default!r}")
        if comments.get(name):
            lines.append(f"      {comments[name]}")
    return "\n".join(lines)


def parse_command_line(cls: type[T], argv: list[str] | None = None, prog: str = "train") -> T:
    """Build ``cls`` from ``--recipe FILE`` and ``--field value`` / ``--field=value`` arguments.

    A bare boolean flag (``--resume``) means true; ``--model_config.KEY VALUE`` sets one entry of
    a dict field. ``-h``/``--help`` prints every field with its default and comment.

    Raises:
        RecipeError: unknown option (naming the closest fields) or a value of the wrong type.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(format_help(cls, prog))
        raise SystemExit(0)
    field_types = _field_types(cls)
    recipe: str | None = None
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise RecipeError(f"unexpected argument {arg!r}: options are written --FIELD VALUE")
        key, eq, value = arg[2:].partition("=")
        key = key.replace("-", "_")
        name, _, subkey = key.partition(".")
        name = canonical_name(cls, name)
        if name != "recipe" and name not in field_types:
            raise RecipeError(f"unknown option --{key}{did_you_mean(name, list(field_types))}")
        if not eq:
            takes_flag = name != "recipe" and bool in _base_types(field_types[name])[0] and not subkey
            if takes_flag and (i + 1 == len(argv) or argv[i + 1].startswith("--")):
                value = "true"
            elif i + 1 < len(argv):
                i += 1
                value = argv[i]
            else:
                raise RecipeError(f"option --{key} needs a value")
        if name == "recipe":
            recipe = value
        elif subkey:
            overrides.setdefault(name, {})[subkey] = yaml.safe_load(value)
        else:
            parsed = coerce(name, value, field_types[name])
            if isinstance(parsed, dict):
                overrides[name] = {**overrides.get(name, {}), **parsed}
            else:
                overrides[name] = parsed
        i += 1
    config = cls()
    if recipe is not None:
        config = config_from_dict(cls, load_recipe(recipe), base=config)
    return config_from_dict(cls, overrides, base=config)


def dump_recipe(config: Any, path: str | Path) -> None:
    """Write every field of ``config`` as a YAML recipe that ``--recipe`` reads back."""
    Path(path).write_text(
        yaml.safe_dump(dataclasses.asdict(config), sort_keys=False, allow_unicode=True), encoding="utf-8"
    )


# ---------------------------------------------------------------------------------------------
# The fine-tuning recipe (training/finetune_trainer.py)

_FINETUNE_AT_LEAST_ONE = (
    "max_steps", "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
    "generation_num_beams", "generation_max_new_tokens", "max_source_length", "max_target_length", "logging_steps",
)  # fmt: skip
_FINETUNE_AT_LEAST_ZERO = (
    "max_train_samples", "max_eval_samples", "max_test_samples", "eval_steps", "save_steps", "warmup_steps",
    "save_total_limit",
)  # fmt: skip


@dataclasses.dataclass
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
        at_least = dict.fromkeys(_FINETUNE_AT_LEAST_ONE, 1) | dict.fromkeys(_FINETUNE_AT_LEAST_ZERO, 0)
        for name, low in at_least.items():
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}; got {getattr(self, name)}")
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
            defaults = {f.name: f.default for f in dataclasses.fields(self)}
            changed = [
                name
                for name in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "merge")
                if getattr(self, name) != defaults[name]
            ]
            if changed:
                raise ValueError(f"{', '.join(changed)} apply to LoRA runs only: add --lora (recipe: lora: true)")


def finetune_config(recipe: str | Path | None = None, overrides: dict[str, Any] | None = None) -> FinetuneConfig:
    """The fine-tuning recipe file ``recipe`` (YAML or JSON; None: the defaults), with ``overrides``
    (field -> value, e.g. the command line's) on top. Not validated (``FinetuneConfig.validate``).

    Raises:
        RecipeError: the file cannot be read, names an unknown field (with the closest valid
            names) or gives a value of the wrong type.
    """
    config = config_from_dict(FinetuneConfig, load_recipe(recipe) if recipe else {})
    return config_from_dict(FinetuneConfig, overrides or {}, base=config)
