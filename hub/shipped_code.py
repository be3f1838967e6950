"""The one way the package ships its code: modules copied, flat, into a folder.

Every export that carries code uses it: the remote code (configuration, modeling, pipeline), the
``custom_generate/`` folder of constrained beam search, the Gradio Space of ``export --space`` and
the ONNX folder's runtime. A shipped module imports the standard library, the third-party packages
its folder declares (``torch`` and ``transformers`` for the remote code) and package modules by
relative imports (``from .x import Y``, ``from ..configuration.configuration_x import C``).
:func:`shipped_files` starts from the modules it is given, follows those relative imports, and
gives each file once under its own name (file names are unique across the package), with every
relative import spelled flat (``from .x import Y``), the one change made to the text. The flat
folder then loads as one package: transformers does that for the remote code and
``custom_generate/``; the Space's ``app.py`` does it for its own folder (hub/space.py). What a
folder's code must know about its export (the Space's model id) is written beside it as JSON,
never into the code.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path

from ..common.errors import UserError

# The packages remote code may import: torch, transformers, and huggingface_hub, which transformers
# itself requires (v5 configurations use its @strict dataclass decorator).
HUB_PACKAGES = frozenset({"torch", "transformers", "huggingface_hub"})


class ExportError(UserError):
    """An export cannot be written; the message says which file or option and what would be valid."""


def shipped_files(modules: Iterable[str], allowed: Iterable[str] = HUB_PACKAGES) -> dict[str, str]:
    """``{file name: text}`` of ``modules`` (dotted names) and the package modules they import,
    flattened, in a fixed order.

    Args:
        modules: the modules to start from, e.g. ``"attention_seq2seq.modeling.modeling_rnn_seq2seq"``.
        allowed: the third-party packages the folder's users install (besides the standard library).

    Raises:
        ExportError: a module imports a package outside ``allowed`` (anywhere in the file, inside
            functions and ``try`` blocks too), imports our package by absolute or dynamic import,
            imports a module that does not exist, or two shipped modules share a file name.
    """
    allowed = frozenset(allowed)
    pending = [(name, None) for name in modules]
    shipped: dict[str, str] = {}
    origins: dict[str, str] = {}
    while pending:
        name, imported_by = pending.pop(0)
        file_name = name.rsplit(".", 1)[-1] + ".py"
        if origins.get(file_name) == name:
            continue
        if file_name in origins:
            raise ExportError(f"{origins[file_name]} and {name} would both ship as {file_name}; rename one")
        path = _module_file(name, imported_by)
        text, imported = flatten(path.read_text(encoding="utf-8"), name, str(path), allowed)
        shipped[file_name], origins[file_name] = text, name
        pending.extend((module, file_name) for module in imported)
    return dict(sorted(shipped.items()))


def write_files(folder: str | Path, files: dict[str, str]) -> list[Path]:
    """Write ``{file name: text}`` into ``folder`` (created if missing); returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return [folder / name for name in files]


def _module_file(name: str, imported_by: str | None) -> Path:
    where = f" (imported by {imported_by})" if imported_by else ""
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        spec = None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py") or spec.submodule_search_locations:
        raise ExportError(f"module {name}{where} is not a module file of the package; shipped code imports modules")
    return Path(spec.origin)


def flatten(text: str, module: str, filename: str, allowed: frozenset[str]) -> tuple[str, list[str]]:
    """Check every import of the module ``module`` (its ``text``) and spell its relative imports
    flat; returns the new text and the dotted names of the package modules it imports.

    Raises:
        ExportError: naming ``filename``, the line and the import that would not load where only
            ``allowed`` and the standard library are installed.
    """
    try:
        tree = ast.parse(text, filename=filename)
    except SyntaxError as error:
        raise ExportError(f"{filename}: cannot be parsed ({error.msg}, line {error.lineno})") from None
    allowed_text = (
        f"is not allowed in shipped code: only the standard library, {', '.join(sorted(allowed))} and package modules"
    )
    package = module.rpartition(".")[0]
    lines = text.split("\n")
    imported: list[str] = []

    def reject(node: ast.AST, what: str, why: str) -> None:
        raise ExportError(f"{filename}:{node.lineno}: {what} {why}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in sys.stdlib_module_names | allowed:
                    reject(node, f"'import {alias.name}'", allowed_text)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            if (node.module or "").split(".")[0] not in sys.stdlib_module_names | allowed:
                reject(node, f"'from {node.module} import ...'", allowed_text)
        elif isinstance(node, ast.ImportFrom):
            if not node.module:
                reject(node, f"'from {'.' * node.level} import ...'", "imports a package; import its modules")
            target = importlib.util.resolve_name("." * node.level + node.module, package)
            if target not in imported:
                imported.append(target)
            line = lines[node.lineno - 1]
            start = line.index("from", node.col_offset)
            end = line.index(" import", start)
            lines[node.lineno - 1] = f"{line[:start]}from .{target.rsplit('.', 1)[-1]}{line[end:]}"
        elif isinstance(node, ast.Call) and _is_dynamic_import(node):
            reject(node, "a dynamic import of attention_seq2seq", "would not exist where the code is shipped")
    return "\n".join(lines), imported


def _is_dynamic_import(node: ast.Call) -> bool:
    name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
    if name not in ("import_module", "__import__"):
        return False
    return any(
        isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("attention_seq2seq")
        for arg in node.args
    )
