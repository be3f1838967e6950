"""The test suite's own layout: no test file imports another test file. What test files share
lives in tests/helpers.py (plain functions) and tests/conftest.py (fixtures); importing a test
module would collect its tests twice over, or run its module-level setup where nobody expects it.
Read from the source with ``ast``: every import counts, also one inside a function, and the
scripts a test writes for a subprocess (string constants holding Python source)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TEST_FILES = sorted(TESTS.glob("test_*.py"))
TEST_MODULES = {path.stem for path in TEST_FILES}
ALLOWED = {"helpers", "conftest"}  # what test files may import from tests/


def _imported_test_modules(tree: ast.AST, test_modules=frozenset(TEST_MODULES)) -> list[tuple[int, str]]:
    """(line, module) of every import in ``tree`` of one of ``test_modules`` (as ``test_x``,
    ``tests.test_x`` or ``from tests import test_x``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + (
                [f"{node.module}.{alias.name}" for alias in node.names] if node.module == "tests" else []
            )
        elif isinstance(node, ast.ImportFrom):  # relative: from . import test_x / from .test_x import y
            names = [node.module] if node.module else [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "tests":
                parts = parts[1:]
            if parts and parts[0] in test_modules and parts[0] not in ALLOWED:
                found.append((node.lineno, parts[0]))
    return found


def _embedded_scripts(tree: ast.AST):
    """String constants that parse as Python containing an import (a subprocess's script)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
            try:
                yield node.lineno, ast.parse(node.value)
            except SyntaxError:
                continue


def test_there_are_test_files_to_check():
    assert len(TEST_FILES) > 10 and Path(__file__) in TEST_FILES


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda path: path.name)
def test_no_test_file_imports_another_test_file(path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    offences = [f"line {line}: imports {module}" for line, module in _imported_test_modules(tree)]
    for line, script in _embedded_scripts(tree):
        offences += [f"line {line} (a script): imports {module}" for _, module in _imported_test_modules(script)]
    assert not offences, f"{path.name} imports test modules (move what it needs to tests/helpers.py): {offences}"


def test_the_check_sees_each_form_of_import():
    source = (
        "import test_a\nfrom test_b import x\nfrom tests.test_c import y\nfrom tests import test_d\n"
        "def f():\n    import tests.test_e\n"
        "from helpers import tiny_model\nimport conftest\nfrom test_helpers_not_a_test import z\n"
    )
    modules = {"test_a", "test_b", "test_c", "test_d", "test_e"}
    found = {module for _, module in _imported_test_modules(ast.parse(source), modules | ALLOWED)}
    assert found == modules
