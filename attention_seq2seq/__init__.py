"""attention_seq2seq: the classic attention models for sequence-to-sequence learning as
transformers v5 models.

The package registers both model families with transformers' Auto classes (``AutoConfig``,
``AutoModel``, ``AutoModelForSeq2SeqLM``), so a folder written by ``save_pretrained`` loads with
``AutoModelForSeq2SeqLM.from_pretrained`` while the package is installed. Hub exports
(``attention-seq2seq export``) carry their own flattened code instead.

Importing the package is cheap (the command line's ``--help`` answers without torch): the model
and config classes load on first use (``attention_seq2seq.TransformerSeq2SeqConfig``), and the Auto
classes are registered as soon as transformers is imported, whichever comes first
(``register_auto_classes()`` does it at once). Registering at import instead would make
``attention-seq2seq --help`` take 3.6 s instead of 0.06 s (docs/DESIGN.md, "Registration with the
Auto classes").
"""

from __future__ import annotations

import importlib
import importlib.abc
import os
import sys

__version__ = "0.1.0"

from .common.errors import lazy_exports
from .modeling.registry import FAMILIES  # a table of names: imports nothing heavy

# The package's translation metric as an evaluate module folder, shipped inside the package:
# ``evaluate.load(TRANSLATION_METRIC_PATH)`` works offline (docs/evaluate-metric.md).
TRANSLATION_METRIC_PATH = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "evaluate_modules", "translation_scores"
)

# Public class -> the submodule that defines it (loaded on first access, PEP 562).
_EXPORTS = {name: module for family in FAMILIES for name, module in family.exports().items()}
_EXPORTS["load_translation_metric"] = ".translation.scores"  # imports evaluate (seconds) only when called

__all__ = [*_EXPORTS, "register_auto_classes", "TRANSLATION_METRIC_PATH"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, before_import=lambda: register_auto_classes())


_registration = {"done": False, "running": False}


def register_auto_classes() -> None:
    """Register every family of modeling/registry.py with the Auto classes, and make
    ``save_pretrained`` after ``register_for_auto_class()`` write the flattened remote code
    (modeling/saving.py). Idempotent; imports transformers and the configuration files.

    A family whose modeling file is not imported yet is registered through a stand-in class
    (:func:`_lazy_model_class`) that imports it on first use, so that importing transformers
    (``attention_seq2seq.data`` does) does not build the torch model files."""
    if _registration["done"] or _registration["running"]:
        return
    _registration["running"] = True
    try:
        from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

        from .modeling import saving

        for family in FAMILIES:
            config_cls = family.config_cls()
            AutoConfig.register(config_cls.model_type, config_cls, exist_ok=True)
            module = sys.modules.get(f"{__name__}.modeling.{family.modeling_module}")
            for auto_cls, attribute in ((AutoModel, "base_model_class"), (AutoModelForSeq2SeqLM, "lm_class")):
                if module is not None:
                    model_cls = getattr(module, getattr(family, attribute))
                else:
                    model_cls = _lazy_model_class(family, attribute, auto_cls)
                auto_cls.register(config_cls, model_cls, exist_ok=True)
        saving.REMOTE_CODE_WRITER = _write_remote_code
        _registration["done"] = True
    finally:
        _registration["running"] = False
    if _REGISTER_HOOK in sys.meta_path:
        sys.meta_path.remove(_REGISTER_HOOK)


def _lazy_model_class(family, attribute: str, auto_cls):
    """A stand-in for the model class ``getattr(family, attribute)`` in ``auto_cls``'s mapping:
    it carries the class's name and ``config_class``; any other attribute (``from_pretrained``,
    ``from_config``, ``_from_config``) or a call imports the modeling file, registers the real
    class in its place and answers from it."""
    name = getattr(family, attribute)
    module = f"{__name__}.modeling.{family.modeling_module}"

    def real():
        cls = getattr(importlib.import_module(module), name)
        auto_cls.register(family.config_cls(), cls, exist_ok=True)
        return cls

    class LazyModelClass(type):
        def __getattr__(cls, item):
            if item.startswith("__"):
                raise AttributeError(item)
            return getattr(real(), item)

        def __call__(cls, *args, **kwargs):
            return real()(*args, **kwargs)

    return LazyModelClass(
        name,
        (),
        {
            "__module__": module,
            "__qualname__": name,
            "config_class": family.config_cls(),
            "__doc__": f"Stand-in for {module}.{name}, imported on first use.",
        },
    )


def _write_remote_code(model, save_directory) -> None:
    from .hub.export import write_remote_code  # imported when first needed

    write_remote_code(model, save_directory)


# --------------------------------------------------------------------------------------------
# Registering once transformers is imported


# Submodules of this package being executed right now (their classes may not exist yet, so
# registering waits until the outermost one has finished); counted by _ThenRegister below.
_running_submodules = [0]


def _register_when_ready() -> None:
    if not _registration["done"] and _running_submodules[0] == 0 and "transformers" in sys.modules:
        register_auto_classes()


class _ThenRegister(importlib.abc.Loader):
    """Wraps a module's loader: after the module has run, register if transformers is loaded and
    none of this package's submodules is still running."""

    def __init__(self, loader, ours: bool):
        self._loader = loader
        self._ours = ours

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        _running_submodules[0] += self._ours
        try:
            self._loader.exec_module(module)
        finally:
            _running_submodules[0] -= self._ours
        _register_when_ready()

    def __getattr__(self, name):  # get_source, get_resource_reader, is_package, ...
        return getattr(self._loader, name)


class _RegisterHook(importlib.abc.MetaPathFinder):
    """Until the families are registered: `transformers` and this package's submodules load
    through `_ThenRegister`, so registering happens right after transformers is imported, or after
    the submodule that imported it has finished."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "transformers" and not fullname.startswith(__name__ + "."):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenRegister(spec.loader, ours=fullname != "transformers")
                return spec
        return None


_REGISTER_HOOK = _RegisterHook()
if "transformers" in sys.modules:
    register_auto_classes()
elif not any(isinstance(finder, _RegisterHook) for finder in sys.meta_path):
    sys.meta_path.insert(0, _REGISTER_HOOK)
