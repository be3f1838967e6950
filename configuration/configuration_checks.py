"""Validation shared by both configuration classes: their base class ``CheckedConfig`` and its helpers.

Shipped to the Hub next to the configuration files (a flat sibling: ``from .configuration_checks
import ...``); imports the standard library and transformers only.
"""

from __future__ import annotations

import difflib
import numbers
import types
import typing
import warnings

from transformers import GenerationConfig, PreTrainedConfig

# Keys a config.json (or transformers itself) hands to a config's constructor that no option of ours
# reads: transformers' bookkeeping, exported folders' remote-code entries, arguments that
# `PreTrainedConfig.__post_init__` consumes. They are never warned about.
BOOKKEEPING_KEYS = frozenset(
    {
        "model_type",
        "name_or_path",
        "transformers_version",
        "torch_dtype",
        "auto_map",
        "custom_pipelines",
        "attn_implementation",
        "experts_implementation",
        "output_attentions",
        "num_labels",
        "per_layer_config",
    }
)


def _accepts(kind: type, value: object) -> bool:
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:  # numpy integers too; True is not a size
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if kind is float:  # an int is a float here (dropout: 0 in a recipe)
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    return isinstance(value, kind)


def check_field_types(config: object) -> None:
    """Raise ``ValueError`` naming the option and its type when a value of the config's own fields
    (those its class declares, not transformers' base fields) has the wrong type.

    ``dropout="high"`` would otherwise fail later with ``'<=' not supported between instances of
    'float' and 'str'``, or be stored and fail when the model is built.
    """
    cls = type(config)
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if name.startswith("_") or name not in cls.__dataclass_fields__:
            continue
        kind = eval(annotation, {}) if isinstance(annotation, str) else annotation  # noqa: S307 (our own annotations)
        union = typing.get_origin(kind) in (typing.Union, types.UnionType)
        kinds = [typing.get_origin(k) or k for k in (typing.get_args(kind) if union else (kind,))]
        value = getattr(config, name)
        if not any(_accepts(k, value) for k in kinds):
            names = " or ".join("None" if k is type(None) else k.__name__ for k in kinds)
            raise ValueError(f"{name} must be {names}; got {value!r}")


def check_choice(name: str, value: object, valid: tuple[str, ...]) -> None:
    """Raise ``ValueError`` naming the option and its valid values when ``value`` is not one of them."""
    if value not in valid:
        choices = ", ".join(repr(v) for v in valid)
        raise ValueError(f"{name} must be one of {choices}; got {value!r}")


def _close_option(config: object, key: str) -> str | None:
    """The option of ``config`` that ``key`` is one typo away from, if any (``d_modle`` -> ``d_model``)."""
    fields = [name for name in type(config).__dataclass_fields__ if not name.startswith("_")]
    if key in fields:
        return None
    close = difflib.get_close_matches(key, fields, n=1, cutoff=0.85)
    return close[0] if close else None


def generation_setting_names(generation_config_class: type, config: object) -> frozenset[str]:
    """The settings of ``generation_config_class`` (transformers' ``GenerationConfig``) that are not
    also options of ``config`` (token ids, ``use_cache``) or transformers' own config arguments."""
    names = set(generation_config_class().to_dict())
    shared = set(type(config).__dataclass_fields__) | {
        "transformers_version",
        "output_attentions",
        "output_hidden_states",
    }
    return frozenset(n for n in names if not n.startswith("_") and n not in shared)


def sort_extra_options(config: CheckedConfig, kwargs: dict) -> dict:
    """Check the keywords a config's dataclass fields did not take; return the generation settings.

    In this order, for each key of ``kwargs`` (left in place unless said otherwise):

    * one typo away from a real option (``d_modle=512``): ``ValueError`` naming the option meant
      (``PreTrainedConfig`` would store it silently, as it stores ``architectures``);
    * another toolkit's name for one of our options (``config.foreign_option_names``: fairseq's
      ``normalize_before``, OpenNMT's ``rnn_type``, ...): ``ValueError`` naming ours;
    * a generation setting (``generation_setting_names``: ``num_beams``, ``max_new_tokens``, ...):
      removed from ``kwargs`` and returned, for the model to put into its ``generation_config``; one
      warning names them all;
    * anything else that is neither a bookkeeping key (``BOOKKEEPING_KEYS``, a private ``_`` key)
      nor an alias (a config's ``attribute_map``): stored as transformers stores unknown keys, with
      one warning naming them all, since no part of the model reads it.

    The first two refuse what a user types; a config read back from what ``save_pretrained`` wrote
    (``transformers_version`` set: a field only ``to_dict`` fills in) is never refused: whatever was
    set on the saved config's object was written, and a config must load what it saved. transformers'
    own helpers set generic names on any config (``testing_utils.set_config_for_less_flaky_test``
    sets ``layer_norm_epsilon``, ``norm_eps``, ...). Such keys are stored with the same one warning,
    which names our option where the key looks like one.

    Raises:
        ValueError: a misspelt option or another toolkit's option name, given by the user.
    """
    name, foreign_names = type(config).__name__, config.foreign_option_names
    if getattr(config, "transformers_version", None) is None:  # typed by a user, not read back from a save
        for key in kwargs:
            if close := _close_option(config, key):
                raise ValueError(f"unknown option {key!r} for {name}; did you mean {close!r}?")
            if key in foreign_names:
                raise ValueError(f"{name} has no option {key!r} (another toolkit's name); use {foreign_names[key]}")
    generation_names = generation_setting_names(GenerationConfig, config)
    generation = {key: kwargs.pop(key) for key in [k for k in kwargs if k in generation_names]}
    if generation:
        listed = ", ".join(f"{key}={value!r}" for key, value in generation.items())
        warnings.warn(
            f"{name}: generation setting(s) {listed} are not model options; moved to the model's "
            f"generation_config (set them there, or pass them to generate())",
            UserWarning,
            stacklevel=4,
        )
    aliases = config.attribute_map
    unknown = [key for key in kwargs if not key.startswith("_") and key not in BOOKKEEPING_KEYS and key not in aliases]
    if unknown:

        def described(key: str) -> str:
            ours = foreign_names.get(key) or _close_option(config, key)
            return f"{key!r} (ours: {ours})" if ours else repr(key)

        warnings.warn(
            f"{name}: unknown option(s) {', '.join(described(key) for key in unknown)} stored in the config but "
            f"read by no part of the model",
            UserWarning,
            stacklevel=4,
        )
    return generation


class CheckedConfig(PreTrainedConfig):
    """A `PreTrainedConfig` that fails in its constructor: the keywords its fields did not take are
    sorted (`sort_extra_options`: refused, moved to the generation config, or stored with a warning),
    its fields' types checked (`check_field_types`), then the family's own `check_options()` runs.

    Subclasses set `foreign_option_names` (other toolkits' names for their options, refused naming
    ours) and write `check_options`, which may also fill in defaults that depend on other options.
    Generation settings given here (`num_beams=3`, ...) are kept as `_generation_settings` for the
    model's `__init__` to put into its `generation_config`; they are never saved with the config.
    """

    foreign_option_names: typing.ClassVar[dict[str, str]] = {}

    def __post_init__(self, **kwargs):
        generation_settings = sort_extra_options(self, kwargs)
        check_field_types(self)
        self.check_options()
        super().__post_init__(**kwargs)
        if generation_settings:
            self._generation_settings = generation_settings

    def check_options(self) -> None:
        """Raise `ValueError` naming the option and what would be valid; fill in dependent defaults."""

    def _remove_keys_not_serialized(self, d: dict) -> None:
        super()._remove_keys_not_serialized(d)
        d.pop("_generation_settings", None)
