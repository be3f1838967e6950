"""Validation helpers shared by both configuration classes.

Shipped to the Hub next to the configuration files (a flat sibling: ``from .configuration_checks
import ...``); standard library only.
"""

from __future__ import annotations

import difflib


def check_choice(name: str, value: object, valid: tuple[str, ...]) -> None:
    """Raise ``ValueError`` naming the option and its valid values when ``value`` is not one of them."""
    if value not in valid:
        choices = ", ".join(repr(v) for v in valid)
        raise ValueError(f"{name} must be one of {choices}; got {value!r}")


def reject_misspelt_options(config: object, kwargs: dict) -> None:
    """Raise ``ValueError`` for an unknown keyword that is one typo away from a real option.

    ``PreTrainedConfig`` stores unknown keys silently (a ``config.json`` carries bookkeeping keys
    such as ``architectures``), so ``d_modle=512`` would otherwise be ignored without a word.
    """
    fields = [name for name in type(config).__dataclass_fields__ if not name.startswith("_")]
    for key in kwargs:
        if key in fields:
            continue
        close = difflib.get_close_matches(key, fields, n=1, cutoff=0.85)
        if close:
            raise ValueError(f"unknown option {key!r} for {type(config).__name__}; did you mean {close[0]!r}?")
