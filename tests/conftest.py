"""Shared test fixtures: seeded, single-threaded torch, a private cache, the shared corpora, no
network, quiet `datasets`. Plain helpers (corpus slices, tiny models, tiny runs) are in helpers.py,
which the test files import; nothing imports this file.

The shared corpora live in ``../shared/data`` next to the repository checkout (CI lays a copy
there too); ``ATTN_SEQ2SEQ_SHARED_DATA`` overrides the location. They are read, never copied.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import shared_data_dir


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
