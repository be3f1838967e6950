"""Tests of hub/push.py: dry runs list the upload without any network; offline fails at once."""

from __future__ import annotations

import socket
import time

import pytest
from huggingface_hub import constants

from attention_seq2seq.hub import push as push_module
from attention_seq2seq.cli import main as cli_main
from attention_seq2seq.hub.push import PushError, list_upload_files, push_to_hub


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "export"
    (root / ".git").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "modeling_x.cpython-311.pyc").write_bytes(b"\0" * 10)
    files = {"config.json": b"{}\n", "model.safetensors": b"\1" * 2048, "README.md": b"---\n---\n# card\n",
             "modeling_x.py": b"import torch\n", "sub/extra.txt": b"abc"}  # fmt: skip
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root, files


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the network was touched")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def test_dry_run_lists_paths_and_sizes_without_network(folder, no_network, capsys):
    root, files = folder
    result = push_to_hub(root, "someone/model", dry_run=True, revision="v1")
    assert [(f.path_in_repo, f.size) for f in result.files] == sorted((k, len(v)) for k, v in files.items())
    assert result.dry_run and result.revision == "v1" and result.total_size == sum(map(len, files.values()))

    assert cli_main(["push", str(root), "someone/model", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("would upload 5 files (2.0 KiB) to someone/model@main")
    for name in files:
        assert name in out
    assert ".git" not in out and "__pycache__" not in out


def test_offline_push_fails_at_once_with_one_line(folder, no_network, monkeypatch, capsys):
    root, _ = folder
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PushError, match="offline: HF_HUB_OFFLINE=1 is set; use --dry-run"):
        push_to_hub(root, "someone/model")

    assert cli_main(["push", str(root), "someone/model"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("attention-seq2seq push: error: cannot push to the Hub while offline")
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.out == ""


def test_unreachable_hub_fails_within_seconds(folder, monkeypatch):
    root, _ = folder
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    start = time.monotonic()
    with pytest.raises(PushError, match=r"cannot connect to 127\.0\.0\.1:9"):
        push_to_hub(root, "someone/model")
    assert time.monotonic() - start < push_module.CONNECT_TIMEOUT_S + 1


def test_push_creates_repo_branch_and_uploads(folder, monkeypatch):
    root, _ = folder
    calls = []

    class RecordingApi:
        def __init__(self, token):
            calls.append(("token", token))

        def create_repo(self, repo_id, **kwargs):
            calls.append(("create_repo", repo_id, kwargs))

        def create_branch(self, repo_id, **kwargs):
            calls.append(("create_branch", repo_id, kwargs))

        def upload_folder(self, **kwargs):
            calls.append(("upload_folder", kwargs))
            return type("Commit", (), {"commit_url": "https://hub/commit/1", "oid": "1" * 40})()

        def upload_file(self, **kwargs):
            calls.append(("upload_file", kwargs))

    import huggingface_hub

    monkeypatch.setattr(push_module, "hub_offline_reason", lambda: None)
    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingApi)
    result = push_to_hub(root, "someone/model", private=True, revision="dev", token="hf_test", commit_message="v1")
    assert calls[0] == ("token", "hf_test")
    assert calls[1] == ("create_repo", "someone/model", {"repo_type": "model", "private": True, "exist_ok": True})
    assert calls[2] == ("create_branch", "someone/model", {"branch": "dev", "repo_type": "model", "exist_ok": True})
    upload = calls[3][1]
    assert (upload["repo_id"], upload["folder_path"], upload["revision"]) == ("someone/model", str(root), "dev")
    assert upload["commit_message"] == "v1" and "__pycache__" in upload["ignore_patterns"]
    assert result.commit_url == "https://hub/commit/1" and not result.dry_run
    assert len(calls) == 4 and result.pinned_revision is None  # a card without the REVISION placeholder: one commit

    # Without a token anywhere, it stops before any request.
    calls.clear()
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(PushError, match="no Hugging Face token: set HF_TOKEN or run `hf auth login`"):
        push_to_hub(root, "someone/model")
    assert calls == []


def test_bad_folder_or_repo_id(tmp_path, folder):
    root, _ = folder
    with pytest.raises(PushError, match="must look like 'user/model-name'"):
        push_to_hub(root, "no-namespace", dry_run=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PushError, match="has no config.json"):
        list_upload_files(tmp_path / "empty")
    with pytest.raises(PushError, match="is not a folder"):
        list_upload_files(tmp_path / "missing")


def test_push_pins_the_exported_card_to_the_upload_s_commit_in_a_second_commit(tmp_path, monkeypatch):
    import huggingface_hub
    from helpers import build_tiny_run

    from attention_seq2seq.hub.export import export_model

    out = export_model(build_tiny_run("rnn_seq2seq", tmp_path), tmp_path / "hub", repo_id="someone/tiny")
    card = (out / "README.md").read_text(encoding="utf-8")
    oid = "3f1c0e9" + "a" * 33
    calls = []

    class RecordingApi:
        def __init__(self, token):
            pass

        def create_repo(self, repo_id, **kwargs):
            pass

        def upload_folder(self, **kwargs):
            calls.append(("upload_folder", kwargs["revision"]))
            return type("Commit", (), {"commit_url": f"https://hub/commit/{oid}", "oid": oid})()

        def upload_file(self, **kwargs):
            calls.append(("upload_file", kwargs))

    monkeypatch.setattr(push_module, "hub_offline_reason", lambda: None)
    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingApi)
    result = push_to_hub(out, "someone/tiny", token="hf_test")
    assert calls[0] == ("upload_folder", "main") and calls[1][0] == "upload_file" and len(calls) == 2
    second = calls[1][1]
    assert (second["path_in_repo"], second["revision"], second["repo_id"]) == ("README.md", "main", "someone/tiny")
    pinned = second["path_or_fileobj"].decode("utf-8")
    (line,) = [line for line in pinned.splitlines() if line.startswith("REVISION = ")]
    assert line.startswith(f'REVISION = "{oid}"')
    assert len(pinned.splitlines()) == len(card.splitlines())  # nothing else of the card changed
    assert [a for a, b in zip(pinned.splitlines(), card.splitlines()) if a != b] == [line]
    assert (out / "README.md").read_text(encoding="utf-8") == card  # the local folder is left as it is
    assert result.pinned_revision == oid and oid in result.describe()

    calls.clear()
    assert push_to_hub(out, "someone/tiny", token="hf_test", pin_card=False).pinned_revision is None
    assert [c[0] for c in calls] == ["upload_folder"]
