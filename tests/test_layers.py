"""The package's layers, read from the source: imports flow one way,

    common/ <- configuration/ <- modeling/ <- data/ <- attention/ <- translation/ <- training/ <- hub/
        <- the command line (attention_seq2seq/cli/, main_job, translate)

and hub/ reads the model registry and the corpus presets, never training/. The bottom folder
common/ (errors, durable writes, file checks) and the evaluate metric folder may be imported from
any layer; they import nothing above them. Every import counts, also one inside a
function; a bare ``import attention_seq2seq`` (which registers the Auto classes) is allowed anywhere."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "attention_seq2seq"

# folder (as installed under attention_seq2seq.) -> layer; higher layers may import lower ones
LAYERS = {
    "common": -1,
    "configuration": 0,
    "modeling": 1,
    "data": 2,
    "attention": 3,
    "translation": 4,
    "training": 5,
    "hub": 6,
}
SHARED = {
    "evaluate_modules",
}  # attention_seq2seq.<name>: usable from every layer (they import nothing of the package)
TOP = 7  # the package root's other modules: cli/, main_job, translate, __init__
FORBIDDEN = {"hub": {"training"}}  # on top of the order: hub/ never imports training/


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (its folders as installed)."""
    found = {}
    for folder in [*LAYERS, "attention_seq2seq"]:
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            relative = path.relative_to(REPO_ROOT / folder).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            prefix = [PACKAGE] if folder == "attention_seq2seq" else [PACKAGE, folder]
            found[".".join(prefix + parts)] = path
    return found


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _imports(module: str, path: Path) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every package import in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if _is_package(path) else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            # `from . import x` / `from .pkg import mod`: the names may be submodules
            found += [(node.lineno, f"{name}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name == PACKAGE or name.startswith(PACKAGE + ".")]


def _layer(name: str) -> tuple[str, int]:
    """The layer (folder name, rank) a dotted package name belongs to."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[1] in LAYERS:
        return parts[1], LAYERS[parts[1]]
    if len(parts) >= 2 and parts[1] in SHARED:
        return "shared", -1
    return "top", TOP


def layering_violations() -> list[str]:
    problems = []
    for module, path in _modules().items():
        layer, rank = _layer(module)
        for line, name in _imports(module, path):
            target, target_rank = _layer(name)
            if name == PACKAGE or (name == f"{PACKAGE}.__version__" and layer == "top"):
                # the root package itself: every submodule import runs it anyway (it registers the Auto classes)
                continue
            if layer == "shared" and target != "shared":
                problems.append(f"{path.relative_to(REPO_ROOT)}:{line}: shared module imports {name}")
            elif target_rank > rank or target in FORBIDDEN.get(layer, ()):
                problems.append(f"{path.relative_to(REPO_ROOT)}:{line}: {layer} imports {name} ({target})")
    return problems


def test_imports_flow_one_way_through_the_layers():
    assert layering_violations() == []


def test_the_layer_check_sees_relative_imports_inside_functions(tmp_path):
    # the reader itself: a relative import in a function body, resolved against the module's package
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from ..training.train import train\n    from . import objectives\n")
    assert _imports("attention_seq2seq.hub.m", path) == [
        (2, "attention_seq2seq.training.train.train"),
        (3, "attention_seq2seq.hub.objectives"),
    ]
    assert _layer("attention_seq2seq.training.train.train") == ("training", LAYERS["training"])
    assert _layer("attention_seq2seq.common.errors.UserError") == ("common", -1)
    assert _layer("attention_seq2seq.cli.main") == ("top", TOP)


_DATA_THEN_AUTO = r"""
import json, sys
import attention_seq2seq.data
loaded_by_data = sorted(m for m in sys.modules if m.startswith("attention_seq2seq.modeling.modeling_"))
from transformers import AutoModelForSeq2SeqLM
from attention_seq2seq.configuration.configuration_rnn_seq2seq import RNNSeq2SeqConfig
model = AutoModelForSeq2SeqLM.from_config(RNNSeq2SeqConfig(vocab_size=40, embedding_size=8, hidden_size=8))
import attention_seq2seq
print(json.dumps([loaded_by_data, type(model) is attention_seq2seq.RNNSeq2SeqForConditionalGeneration]))
"""


def test_importing_the_data_layer_builds_no_model_yet_the_auto_classes_still_work():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _DATA_THEN_AUTO], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [[], True]


def test_the_package_root_is_only_the_package_s_face():
    # The root holds the package's face (registration, the entry points: the main job,
    # translate for launchers, the attention explorer's app); translation,
    # attention analysis and scores live in their own layers (docs/layout.md).
    root = REPO_ROOT / "attention_seq2seq"
    modules = sorted(p.name for p in root.glob("*.py"))
    folders = sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert modules == ["__init__.py", "explorer_app.py", "main_job.py", "translate.py"]
    assert folders == ["cli", "evaluate_modules"]
    for layer in LAYERS:
        assert (REPO_ROOT / layer / "__init__.py").exists(), layer
