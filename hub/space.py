"""The attention explorer as a Gradio Space: ``export --space`` adds it to an export.

``write_space(folder, repo_id)`` ships the explorer app (``attention_seq2seq/explorer_app.py``)
and the modules it imports (``attention/explorer.py``, ``attention/fonts.py``, the attention
pass) flat into ``folder`` the way every export ships code (hub/shipped_code.py), and writes
beside them ``app.py``, which loads that flat folder as one package and starts the app,
``space.json`` naming the Space's default model, and a ``requirements.txt`` naming only the Hub
packages (gradio, torch, transformers). A module shared with the remote code (the attention pass)
is the same file in both. The app loads the model through transformers with
``trust_remote_code=True``, i.e. with the export's own shipped code: this package is not needed
there.

``python app.py`` serves the folder's model (its ``config.json`` sits beside ``app.py``); a Space
repo holding only the files written here serves ``repo_id`` (or ``$MODEL_ID``) from the Hub.
"""

from __future__ import annotations

import json
from pathlib import Path

from .shipped_code import HUB_PACKAGES, shipped_files, write_files

APP_MODULE = "attention_seq2seq.explorer_app"
SETTINGS_FILE = "space.json"  # the explorer app's SPACE_SETTINGS
# The packages the app imports besides the Hub ones (numpy comes with gradio; matplotlib is used when
# present), and the requirements in the ranges this package is tested with (pyproject.toml's demo
# extra pins the same gradio range).
APP_PACKAGES = HUB_PACKAGES | {"gradio", "numpy", "matplotlib"}
REQUIREMENTS = ("gradio>=6.31,<7", "torch>=2.6", "transformers>=5.24,<5.25")

# The Space's entry point: the flat modules beside it load as the package ``attention_explorer``.
APP_PY = '''"""The attention explorer of attention-seq2seq (written by `attention-seq2seq export --space`).

Its modules lie flat beside this file and load as one package; space.json names the model."""

import importlib.util
import sys
from pathlib import Path

_package = importlib.util.module_from_spec(importlib.util.spec_from_loader("attention_explorer", None, is_package=True))
_package.__path__ = [str(Path(__file__).resolve().parent)]
sys.modules["attention_explorer"] = _package

from attention_explorer.explorer_app import build_app, explain, launch, load_model, main  # noqa: E402, F401

if __name__ == "__main__":
    main()
'''


def write_space(folder: str | Path, repo_id: str | None = None) -> list[Path]:
    """Write the explorer's modules, ``app.py``, ``space.json`` (``{"model": repo_id}``) and
    ``requirements.txt`` into ``folder``; returns them.

    Raises:
        ExportError: a shipped module imports something the Space does not install.
    """
    files = {
        **shipped_files([APP_MODULE], APP_PACKAGES),
        "app.py": APP_PY,
        SETTINGS_FILE: json.dumps({"model": repo_id}) + "\n",
        "requirements.txt": "".join(line + "\n" for line in REQUIREMENTS),
    }
    return write_files(folder, files)
