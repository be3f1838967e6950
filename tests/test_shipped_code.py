"""Tests of hub/shipped_code.py, the one way code ships: modules and their package imports, flat.

Each export's own test proves its folder loads without the package: test_hub_export.py (remote
code), test_constraints.py (custom_generate/), test_explorer.py (the Space), test_onnx.py (the
ONNX runtime)."""

from __future__ import annotations

import sys

import pytest

from attention_seq2seq.hub.export import collect_shipped_code
from attention_seq2seq.hub.shipped_code import HUB_PACKAGES, ExportError, flatten, shipped_files
from attention_seq2seq.modeling.registry import BY_MODEL_TYPE


def test_flatten_spells_package_imports_flat_and_names_them():
    text = (
        "from ..configuration.configuration_x import XConfig\n"
        "from ..configuration.configuration_y import (\n    A,\n    B,\n)\n"
        "from .rnn_attention import Luong\n"
        "from transformers import PreTrainedModel\n"
        "def f():\n    from .attention.fonts import css\n"
    )
    flat, imported = flatten(text, "pkg.modeling.m", "m.py", HUB_PACKAGES)
    assert flat == (
        "from .configuration_x import XConfig\n"
        "from .configuration_y import (\n    A,\n    B,\n)\n"
        "from .rnn_attention import Luong\n"
        "from transformers import PreTrainedModel\n"
        "def f():\n    from .fonts import css\n"
    )
    assert imported == [
        "pkg.configuration.configuration_x",
        "pkg.configuration.configuration_y",
        "pkg.modeling.rnn_attention",
        "pkg.modeling.attention.fonts",
    ]


@pytest.mark.parametrize(
    "line, message",
    [
        ("import numpy as np", "m.py:3: 'import numpy' is not allowed in shipped code"),
        ("from attention_seq2seq.data import x", "'from attention_seq2seq.data import ...'"),
        ("from . import helpers", "'from . import ...' imports a package"),
        ("def f():\n    import sacrebleu", "m.py:4: 'import sacrebleu'"),
        ("import importlib\nimportlib.import_module('attention_seq2seq.data')", "dynamic import"),
    ],
)
def test_shipped_code_with_a_disallowed_import_fails_loudly(line, message):
    text = f"import os\nimport torch\n{line}\n"
    with pytest.raises(ExportError, match=message.replace("(", r"\(").replace(".", r"\.")):
        flatten(text, "pkg.modeling.m", "m.py", HUB_PACKAGES)


def test_shipped_files_follow_package_imports_and_check_them(tmp_path, monkeypatch):
    root = tmp_path / "shipme"
    for folder in ("", "modeling", "configuration"):
        (root / folder).mkdir(exist_ok=True)
        (root / folder / "__init__.py").write_text("")
    (root / "configuration" / "configuration_x.py").write_text("import json\n")
    (root / "modeling" / "modeling_x.py").write_text(
        "from ..configuration.configuration_x import C\nfrom .helpers import h\n"
    )
    (root / "modeling" / "helpers.py").write_text("from .more_helpers import g\n")
    (root / "modeling" / "more_helpers.py").write_text("import transformers\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def ship():
        for name in [m for m in sys.modules if m.startswith("shipme")]:
            del sys.modules[name]
        return shipped_files(["shipme.modeling.modeling_x"])

    shipped = ship()
    assert list(shipped) == ["configuration_x.py", "helpers.py", "modeling_x.py", "more_helpers.py"]
    assert shipped["modeling_x.py"].startswith("from .configuration_x import C\n")

    (root / "modeling" / "more_helpers.py").write_text("import scipy\n")
    with pytest.raises(ExportError, match=r"more_helpers\.py:1: 'import scipy'"):
        ship()
    (root / "modeling" / "helpers.py").write_text("from .missing import g\n")
    with pytest.raises(ExportError, match=r"shipme\.modeling\.missing \(imported by helpers\.py\)"):
        ship()
    (root / "modeling" / "helpers.py").write_text("from ..configuration.configuration_x import C\n")
    (root / "modeling" / "configuration_x.py").write_text("")
    (root / "modeling" / "modeling_x.py").write_text("from .configuration_x import C\nfrom .helpers import h\n")
    with pytest.raises(ExportError, match="shipme.configuration.configuration_x would both ship as configuration_x.py"):
        ship()


def test_the_package_code_ships_clean():
    for family in BY_MODEL_TYPE.values():
        shipped = collect_shipped_code(family)
        assert "pipeline_translation.py" in shipped
        assert all("from .." not in text for text in shipped.values())
