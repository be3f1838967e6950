"""The attention explorer as a Gradio Space: ``app.py`` and ``requirements.txt`` for an export.

``write_space(folder, repo_id)`` copies the explorer (``attention/explorer.py``) as
``app.py``, its font list (``attention/fonts.py``) as ``attention_fonts.py``, the sentence-level
attention pass (``attention/sentences.py``) as ``attention_sentences.py`` and the teacher-forced
pass below it (``modeling/attention_pass.py``, with the flat sibling it imports,
``modeling/generation_lengths.py``) as ``modeling_attention_pass.py`` and
``modeling_generation_lengths.py`` into ``folder``, and writes a ``requirements.txt`` naming only
the Hub packages (gradio, torch, transformers). Each copy is named after its folder and file, so
it never replaces the export's own flat ``attention_pass.py`` / ``generation_lengths.py`` (the
remote code); in the copies, ``from .x import`` of a sibling becomes ``from modeling_x import``.
The app loads the model through transformers with ``trust_remote_code=True``, i.e. with the
export's own flattened code: this package is not needed there.

``python app.py`` serves the folder's model (its ``config.json`` sits beside ``app.py``); a Space
repo holding only ``app.py``, the two ``attention_*.py`` and the two ``modeling_*.py`` copies and
``requirements.txt`` serves ``repo_id`` (or ``$MODEL_ID``) from the Hub instead.
"""

from __future__ import annotations

import re
from pathlib import Path

APP_FILE = "app.py"
FONTS_FILE = "attention_fonts.py"
SENTENCES_FILE = "attention_sentences.py"
REQUIREMENTS_FILE = "requirements.txt"
# The modeling/ module attention/sentences.py imports; it and its flat siblings ship as modeling_<name>.py.
PASS_MODULE = "attention_pass"
MODELING_PREFIX = "modeling_"

# The Hub packages the app imports (numpy comes with gradio), in the ranges this package is tested
# with; pyproject.toml's demo extra pins the same gradio range.
REQUIREMENTS = ("gradio>=6.31,<7", "torch>=2.6", "transformers>=5.24,<5.25")

_DEFAULT_MODEL = re.compile(r"^DEFAULT_MODEL = None\b.*$", re.MULTILINE)
_SIBLING_IMPORT = re.compile(r"^(\s*from\s+)\.(\w+)(\s+import\b)", re.MULTILINE)


def app_source(repo_id: str | None = None) -> str:
    """The text of ``app.py``: the explorer module, with ``DEFAULT_MODEL`` set to ``repo_id``."""
    explorer = _package_file("explorer.py")
    text = explorer.read_text(encoding="utf-8")
    if not _DEFAULT_MODEL.search(text):
        raise RuntimeError(f"{explorer} has no 'DEFAULT_MODEL = None' line to fill in")
    header = "# The attention explorer of attention-seq2seq (written by `attention-seq2seq export --space`).\n"
    return header + _DEFAULT_MODEL.sub(f"DEFAULT_MODEL = {repo_id!r}", text, count=1)


def _package_file(name: str) -> Path:
    """A file of the ``attention/`` folder (the explorer, its font list and the sentence-level pass)."""
    from .. import attention

    return Path(attention.__file__).resolve().parent / name


def modeling_copies() -> dict[str, str]:
    """``{file name: text}`` of ``modeling/attention_pass.py`` and the flat siblings it imports
    (recursively), each as ``modeling_<name>.py`` with ``from .x import`` rewritten to
    ``from modeling_x import``.

    Raises:
        ExportError: a copied module imports something other than the standard library, torch,
            transformers and flat siblings (hub/export.py's rule for shipped code).
    """
    from .. import modeling
    from .export import check_shipped_imports

    folder = Path(modeling.__file__).resolve().parent
    copies: dict[str, str] = {}
    pending = [PASS_MODULE]
    while pending:
        name = pending.pop(0)
        file_name = f"{MODELING_PREFIX}{name}.py"
        if file_name in copies:
            continue
        path = folder / f"{name}.py"
        text = path.read_text(encoding="utf-8")
        pending.extend(check_shipped_imports(text, str(path)))
        copies[file_name] = _SIBLING_IMPORT.sub(rf"\1{MODELING_PREFIX}\2\3", text)
    return copies


def write_space(folder: str | Path, repo_id: str | None = None) -> list[Path]:
    """Write ``app.py``, ``attention_fonts.py``, ``attention_sentences.py``, the ``modeling_*.py``
    copies of the attention pass (:func:`modeling_copies`) and ``requirements.txt`` into ``folder``; returns them."""
    folder = Path(folder)
    files = {
        APP_FILE: app_source(repo_id),
        FONTS_FILE: _package_file("fonts.py").read_text(encoding="utf-8"),
        SENTENCES_FILE: _package_file("sentences.py").read_text(encoding="utf-8"),
        **modeling_copies(),
        REQUIREMENTS_FILE: "".join(line + "\n" for line in REQUIREMENTS),
    }
    written = []
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
        written.append(folder / name)
    return written
