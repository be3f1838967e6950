"""Shared test fixtures: seeded, single-threaded torch, and paths to the shared corpora.

The shared corpora live in ``../shared/data`` next to the repository checkout (CI lays a copy
there too); ``ATTN_SEQ2SEQ_SHARED_DATA`` overrides the location. They are read, never copied.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import psutil
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    env = os.environ.get("ATTN_SEQ2SEQ_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


# Public-domain Bible verse pairs committed with the tests (fixtures/bible-es-en/README.md): the
# behaviours checked on Multi30k slices run on these where ../shared/data is absent.
FIXTURE_PAIRS = REPO_ROOT / "tests" / "fixtures" / "bible-es-en"


# Tatoeba zh-en pairs (CC BY 2.0 FR, attribution in fixtures/tatoeba-cmn-eng/cmn.txt and README.md):
# 300 train, 50 dev and 50 test pairs of the shared split, in its layout, for the Chinese checks.
FIXTURE_TATOEBA = REPO_ROOT / "tests" / "fixtures" / "tatoeba-cmn-eng"


def tatoeba_dir() -> Path:
    """The Tatoeba cmn-eng folder (``train|dev|test.tsv``, ``cmn.txt``): the shared corpus when
    present, else the committed slice of it."""
    shared = shared_data_dir() / "tatoeba-cmn-eng"
    return shared if (shared / "train.tsv").exists() else FIXTURE_TATOEBA


def _pairs_source() -> tuple[Path, str, str, dict[str, str]]:
    """(folder, source language, target language, {train|val|test: file stem}) of the test pairs:
    the shared Multi30k corpus when present, else the committed Bible pairs."""
    multi30k = shared_data_dir() / "multi30k"
    if (multi30k / "train.en").exists():
        return multi30k, "de", "en", {"train": "train", "val": "val", "test": "test2016"}
    return FIXTURE_PAIRS, "es", "en", {"train": "train", "val": "dev", "test": "test"}


def read_pairs(n: int, split: str = "train", offset: int = 0) -> list[tuple[str, str]]:
    """``n`` (source, target) pairs from ``offset`` of the ``train``, ``val`` or ``test`` split:
    Multi30k de-en from ../shared/data when present, else the committed Bible es-en pairs."""
    root, src, tgt, stems = _pairs_source()
    stem = stems[split]
    with (
        open(root / f"{stem}.{src}", encoding="utf-8") as f_src,
        open(root / f"{stem}.{tgt}", encoding="utf-8") as f_tgt,
    ):
        pairs = [(s.rstrip("\n"), t.rstrip("\n")) for s, t in zip(f_src, f_tgt)]
    if offset + n > len(pairs):
        raise ValueError(f"{root} has {len(pairs)} {split} pairs; asked for {n} from {offset}")
    return pairs[offset : offset + n]


def pairs_corpus_spec() -> str:
    """The corpus spec of `read_pairs`' pairs, for the loaders and the training script."""
    root, src, tgt, _ = _pairs_source()
    kind = "multi30k" if root.name == "multi30k" else "text"
    return f"{kind}:{root}:{src}-{tgt}"


def pairs_languages() -> tuple[str, str]:
    return _pairs_source()[1:3]


# The smallest model of each family the tests build; every builder states what it needs on top.
TINY_SIZES = {
    "rnn_seq2seq": dict(embedding_size=8, hidden_size=8),
    "transformer_seq2seq": dict(
        d_model=8,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=16,
        decoder_ffn_dim=16,
    ),
}


def tiny_model_config(family: str, vocab_size: int, **overrides):
    """A tiny config of ``family`` (``"rnn_seq2seq"`` or ``"transformer_seq2seq"``, as in the
    model registry): :data:`TINY_SIZES` with ``vocab_size`` and ``overrides`` on top."""
    from attention_seq2seq.modeling.registry import BY_MODEL_TYPE

    return BY_MODEL_TYPE[family].config_cls()(**{**TINY_SIZES[family], "vocab_size": vocab_size, **overrides})


def tiny_model(family: str, vocab_size: int, seed: int | None = None, **overrides):
    """A ``...ForConditionalGeneration`` of :func:`tiny_model_config` (initialised after
    ``torch.manual_seed(seed)`` when ``seed`` is given)."""
    import torch

    from attention_seq2seq.modeling.registry import BY_MODEL_TYPE

    config = tiny_model_config(family, vocab_size, **overrides)
    if seed is not None:
        torch.manual_seed(seed)
    return BY_MODEL_TYPE[family].lm_cls()(config)


def run_process_tree(command: list[str], timeout: float, **popen_kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True)`` for launchers of several ranks
    (``accelerate launch``, ``torchrun``): on a timeout or Ctrl-C it kills the whole process
    tree, because torchrun's agent starts each rank in a session of its own, out of reach of a
    signal to the launcher; a timeout fails the test with the end of stderr."""
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen_kwargs)
    try:
        stdout, stderr = launcher.communicate(timeout=timeout)
    except BaseException as error:  # a hang (ranks waiting in mismatched collectives) or Ctrl-C
        tree = psutil.Process(launcher.pid).children(recursive=True) + [psutil.Process(launcher.pid)]
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(tree, timeout=30)
        stdout, stderr = launcher.communicate()
        if isinstance(error, subprocess.TimeoutExpired):
            pytest.fail(
                f"{Path(command[0]).name} did not finish in {timeout} s "
                f"(ranks hung in a collective?):\n{stderr[-3000:]}"
            )
        raise
    return subprocess.CompletedProcess(command, launcher.returncode, stdout, stderr)


@pytest.fixture(autouse=True)
def _seeded_single_thread():
    import torch

    torch.manual_seed(0)
    # One thread: tests run in parallel processes on a 2-core machine and must be deterministic.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Prepared corpora (data/prepared.py) and other caches go to a folder of this test session,
    never to the user's ~/.cache; a test that needs an empty cache sets its own."""
    previous = os.environ.get("ATTENTION_SEQ2SEQ_CACHE")
    os.environ["ATTENTION_SEQ2SEQ_CACHE"] = str(tmp_path_factory.mktemp("attention_seq2seq_cache"))
    yield
    if previous is None:
        os.environ.pop("ATTENTION_SEQ2SEQ_CACHE", None)
    else:
        os.environ["ATTENTION_SEQ2SEQ_CACHE"] = previous


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared corpora, for checks of their own figures (counts, licenses): skips without them."""
    path = shared_data_dir()
    if not (path / "multi30k" / "train.en").exists():
        pytest.skip(f"shared corpora not found at {path} (set ATTN_SEQ2SEQ_SHARED_DATA)")
    return path


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection from this process fails the test."""
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError(f"a test tried to use the network: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(scope="module")
def quiet_datasets():
    """No `datasets` progress bars in the test output."""
    import datasets

    datasets.disable_progress_bars()
    yield
    datasets.enable_progress_bars()
