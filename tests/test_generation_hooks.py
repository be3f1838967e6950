"""The private `GenerationMixin` members our classes override or call, listed in docs/modeling.md
("Private GenerationMixin hooks"), exist in the pinned transformers: an upgrade that drops or renames
one fails here, not silently in a user's `generate()` (a dropped hook would simply stop being called).
"""

import ast
import inspect
import re
from pathlib import Path

import transformers.generation.utils as generation_utils
from transformers import GenerationMixin

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("configuration", "modeling", "data", "training", "translation", "attention", "hub")
# Not an attribute of GenerationMixin: beam search looks it up on the model with hasattr().
LOOKED_UP_HOOKS = {"_reorder_cache": "self._reorder_cache("}


def documented_hooks() -> set[tuple[str, str]]:
    """(file, hook) of each row of docs/modeling.md's table of private GenerationMixin hooks."""
    text = (ROOT / "docs" / "modeling.md").read_text(encoding="utf-8")
    section = text.split("## Private `GenerationMixin` hooks", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([\w/]+\.py)` \| `(_\w+)` \|", section, re.MULTILINE))


def private_generation_members() -> set[str]:
    return {name for name in dir(GenerationMixin) if name.startswith("_") and not name.startswith("__")}


def test_every_documented_hook_exists_in_the_pinned_transformers():
    rows = documented_hooks()
    assert len(rows) >= 10, rows  # the table was read
    source = inspect.getsource(generation_utils)
    members = private_generation_members()
    for file, hook in sorted(rows):
        if hook in LOOKED_UP_HOOKS:
            assert LOOKED_UP_HOOKS[hook] in source, f"transformers' generate no longer calls {hook} ({file})"
        else:
            assert hook in members, f"{hook}, overridden or called in {file}, is gone from GenerationMixin"


def test_every_overridden_hook_is_documented():
    """Each private GenerationMixin member defined in a class that derives from a GenerationMixin."""
    hooks = private_generation_members() | set(LOOKED_UP_HOOKS)
    overridden = set()
    for folder in PACKAGE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                bases = [ast.unparse(base) for base in getattr(node, "bases", ())]
                if isinstance(node, ast.ClassDef) and any(base.endswith("GenerationMixin") for base in bases):
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef) and item.name in hooks:
                            overridden.add((path.relative_to(ROOT).as_posix(), item.name))
    assert overridden, "no override found: the scan is broken"
    assert overridden <= documented_hooks(), f"not in docs/modeling.md: {sorted(overridden - documented_hooks())}"
