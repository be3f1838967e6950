"""Reading hyperparameters: recipe files (YAML or JSON) and command-line overrides.

The hyperparameter dataclass itself, ``TrainConfig``, lives in ``train_config.py``; the helpers
here work on any flat dataclass whose fields have simple types (``int``, ``float``, ``str``,
``bool``, optional forms of these, and ``dict``).

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

from ..errors import UserError, did_you_mean

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
