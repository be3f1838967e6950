"""transformers' own common model tests (``ModelTesterMixin``, ``ConfigTester``), taken from the source
distribution of the INSTALLED transformers on PyPI and kept in a cache folder, never in this repository.

Run as a script, it fetches them once (``scripts/test.sh`` does, before pytest; ``.ci/run`` does and
fails if it cannot)::

    python tests/transformers_common_tests.py      # -> ~/.cache/attention_seq2seq/transformers-tests-<version>

``pip download --no-binary :all: --no-deps transformers==<version>`` gives the sdist; its ``tests/``
folder is extracted as the package ``transformers_tests`` (a name that cannot clash with this
repository's ``tests``). ``ATTENTION_SEQ2SEQ_TRANSFORMERS_TESTS`` overrides the cache root (not
``ATTENTION_SEQ2SEQ_CACHE``, which tests/conftest.py points at a folder of each test session).

What the sdist does not ship (transformers' repository has it, PyPI does not):

* ``tests/generation/test_utils.py`` (``GenerationTesterMixin``): the ``generate`` tests are NOT run;
* ``tests/exporters/test_export.py`` (``ExportTesterMixin``, a base class of ``ModelTesterMixin``):
  the ``torch.export`` tests are NOT run;
* ``tests/utils/test_configuration_utils.py`` (``config_common_kwargs``): ``ConfigTester``'s
  ``check_config_arguments_init`` is not run.

``test_modeling_common.py`` imports all three, so each gets an empty stand-in module whose only
purpose is to let that import succeed (``_SHIMS``); no test is taken from them.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import types
from importlib.metadata import version as installed_version
from pathlib import Path

PACKAGE = "transformers_tests"


def transformers_version() -> str:
    return installed_version("transformers")


def cache_root() -> Path:
    env = os.environ.get("ATTENTION_SEQ2SEQ_TRANSFORMERS_TESTS")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "attention_seq2seq"


def tests_home(version: str | None = None) -> Path:
    """The folder holding the package ``transformers_tests`` of transformers ``version``."""
    return cache_root() / f"transformers-tests-{version or transformers_version()}"


def how_to_fetch() -> str:
    return (
        f"transformers {transformers_version()}'s common model tests are not in {tests_home()}; "
        f"fetch them from PyPI with `python tests/transformers_common_tests.py`"
    )


def is_fetched(version: str | None = None) -> bool:
    return (tests_home(version) / PACKAGE / "test_modeling_common.py").is_file()


def fetch(version: str | None = None) -> Path:
    """Download transformers ``version``'s sdist (PyPI, through pip) and extract its ``tests/`` folder
    as ``<tests_home>/transformers_tests``; a no-op when it is there. Returns ``tests_home``.

    The extraction goes to a temporary sibling folder renamed into place, so two processes fetching
    at once (pytest workers, two checkouts) never see half a folder.

    Raises:
        RuntimeError: pip could not download the sdist (offline, no such version), with pip's last line.
    """
    version = version or transformers_version()
    home = tests_home(version)
    if is_fetched(version):
        return home
    home.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home.parent, prefix=".fetch-") as work:
        work = Path(work)
        command = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps"]
        command += ["--quiet", "--dest", str(work), f"transformers=={version}"]
        done = subprocess.run(command, capture_output=True, text=True)
        archives = sorted(work.glob("transformers-*.tar.gz"))
        if done.returncode != 0 or not archives:
            last = (done.stderr.strip().splitlines() or ["no sdist downloaded"])[-1]
            raise RuntimeError(f"pip download transformers=={version} (sdist) failed: {last}")
        staged = work / "staged"
        prefix = f"transformers-{version}/tests/"
        with tarfile.open(archives[0]) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
            for member in members:
                member.name = f"{PACKAGE}/" + member.name[len(prefix) :]
            archive.extractall(staged, members=members, filter="data")
        # transformers' repository has tests/__init__.py (the sdist does not): test_configuration_common
        # reads it through `direct_transformers_import`, and it makes the folder a regular package.
        (staged / PACKAGE / "__init__.py").touch()
        if not (staged / PACKAGE / "test_modeling_common.py").is_file():
            raise RuntimeError(f"transformers {version}'s sdist has no tests/test_modeling_common.py")
        try:
            home.mkdir()
        except FileExistsError:
            if is_fetched(version):  # another process finished first
                return home
        if (home / PACKAGE).exists():  # a partial copy from an interrupted older layout
            shutil.rmtree(home / PACKAGE)
        try:
            (staged / PACKAGE).rename(home / PACKAGE)
        except OSError:
            if not is_fetched(version):
                raise
    return home


# Modules test_modeling_common.py / test_configuration_common.py import that the sdist does not ship:
# module name -> {attribute: value}. Empty stand-ins, so that the import succeeds; they add no test.
_SHIMS = {
    "exporters": {},
    "exporters.test_export": {"ExportTesterMixin": type("ExportTesterMixin", (), {})},
    "generation": {},
    "generation.test_utils": {"GenerationTesterMixin": type("GenerationTesterMixin", (), {})},
    "utils": {},
    "utils.test_configuration_utils": {"config_common_kwargs": None},
}


def import_common_tests() -> tuple[types.ModuleType, types.ModuleType]:
    """``(test_modeling_common, test_configuration_common)`` of the fetched tests.

    Raises:
        FileNotFoundError: not fetched; the message says how to fetch them.
    """
    if not is_fetched():
        raise FileNotFoundError(how_to_fetch())
    home = str(tests_home())
    if home not in sys.path:
        sys.path.insert(0, home)
    package_dir = tests_home() / PACKAGE
    for name, attributes in _SHIMS.items():
        full = f"{PACKAGE}.{name}"
        if full in sys.modules or (package_dir / (name.replace(".", "/") + ".py")).exists():
            continue
        module = types.ModuleType(
            full, "stand-in: not shipped in transformers' sdist (tests/transformers_common_tests.py)"
        )
        if "." not in name:
            module.__path__ = []  # a package, so that its submodule stand-in can be attached
        module.__dict__.update(attributes)
        sys.modules[full] = module
    modeling = importlib.import_module(f"{PACKAGE}.test_modeling_common")
    configuration = importlib.import_module(f"{PACKAGE}.test_configuration_common")
    return modeling, configuration


if __name__ == "__main__":
    try:
        where = fetch()
    except RuntimeError as error:
        print(f"[tests] transformers' common model tests: {error}", file=sys.stderr)
        sys.exit(1)
    print(f"[tests] transformers {transformers_version()}'s common model tests: {where / PACKAGE}")
