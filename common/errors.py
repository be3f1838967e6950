"""What every layer shares: the one exception type the command line turns into a one-line message
(exit status 2), ``did_you_mean`` for its messages, and ``lazy_exports`` for the package's
``__init__`` files."""

import importlib


class UserError(Exception):
    """A mistake the user can fix (a missing folder, a bad option value); not a bug.

    The command line prints ``attention-seq2seq <command>: error: <message>`` and exits with 2,
    without a traceback.
    """


def did_you_mean(name: str, valid, n: int = 3, cutoff: float = 0.6) -> str:
    """``" (did you mean 'a', 'b'?)"`` for the entries of ``valid`` closest to ``name``
    (``difflib.get_close_matches``), or ``""`` when none is close: the tail of an
    "unknown option" message. (Shipped configuration code keeps its own copy: an export may
    import nothing from this package.)"""
    import difflib

    close = difflib.get_close_matches(name, list(valid), n=n, cutoff=cutoff)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""


def lazy_exports(package: str, exports: dict[str, str], before_import=None):
    """``(__getattr__, __dir__)`` of a package whose public names load on first use (PEP 562):
    ``exports`` maps each name to the submodule defining it (``".corpora"``), imported only when
    the name is first read (``before_import()`` runs first, if given)."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if before_import is not None:
            before_import()
        value = namespace[name] = getattr(importlib.import_module(exports[name], package), name)
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
