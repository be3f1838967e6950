"""Upload an exported folder to the Hugging Face Hub: the one place the package touches the network.

``push_to_hub(folder, repo_id)`` creates the model repository if needed (optionally private),
creates the branch ``revision`` if it is not ``main``, and uploads the folder in one commit. Then,
where the folder's model card (written by ``export``) sets ``REVISION = "main"`` as a placeholder,
a second commit changes only ``README.md`` so the card pins the first commit: the snippets a user
copies load exactly the code uploaded (and listed in its SHA-256 table), whatever is pushed later.
The local folder is left as it is. The token comes from the ``token`` argument, else
``HF_TOKEN``, else the ``hf auth login`` cache.

Offline (``HF_HUB_OFFLINE=1``, or the Hub's host does not accept a connection within a few
seconds) it raises ``PushError`` at once instead of waiting on long HTTP timeouts;
``dry_run=True`` lists what would be uploaded and touches no network at all.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..common.errors import UserError

# Never uploaded: what huggingface_hub's upload_folder skips, plus Python bytecode caches.
IGNORE_PATTERNS = ("__pycache__", "__pycache__/*", "*/__pycache__/*", "*.pyc")
CONNECT_TIMEOUT_S = 5.0
# The placeholder line of hub_cards/usage.md that a push replaces with the upload's commit id.
_REVISION_PLACEHOLDER = re.compile(r'^REVISION = "main"  # replace with the commit id you reviewed.*$', re.M)


class PushError(UserError):
    """The upload cannot happen; the message is one line the CLI prints as it is."""


@dataclass(frozen=True)
class UploadFile:
    """One file of a planned upload: its path in the repository and its size in bytes."""

    path_in_repo: str
    size: int


@dataclass(frozen=True)
class PushResult:
    """What ``push_to_hub`` did (or, with ``dry_run``, would do)."""

    repo_id: str
    revision: str
    files: list[UploadFile]
    dry_run: bool
    commit_url: str | None = None
    pinned_revision: str | None = None  # the commit the uploaded card's REVISION names

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def describe(self) -> str:
        """A human-readable listing: one line per file (size, path), then the total."""
        verb = "would upload" if self.dry_run else "uploaded"
        lines = [f"{verb} {len(self.files)} files ({_human(self.total_size)}) to {self.repo_id}@{self.revision}"]
        lines += [f"  {_human(f.size):>10}  {f.path_in_repo}" for f in self.files]
        if self.commit_url:
            lines.append(f"commit: {self.commit_url}")
        if self.pinned_revision:
            lines.append(
                f'the model card pins REVISION = "{self.pinned_revision}" (the upload\'s commit: its code is '
                "what the card's SHA-256 table lists)"
            )
        return "\n".join(lines)


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def list_upload_files(folder: str | os.PathLike) -> list[UploadFile]:
    """The files ``push_to_hub`` uploads from ``folder``, sorted by path, with their sizes.

    Skips what huggingface_hub's ``upload_folder`` skips (``.git``, ``.cache/huggingface``) and
    Python bytecode caches.

    Raises:
        PushError: ``folder`` is not a folder, has no ``config.json``, or holds no file to upload.
    """
    from huggingface_hub.utils import filter_repo_objects
    from huggingface_hub.utils._paths import DEFAULT_IGNORE_PATTERNS

    root = Path(folder)
    if not root.is_dir():
        raise PushError(f"{root} is not a folder; push uploads a folder written by `attention-seq2seq export`")
    if not (root / "config.json").is_file():
        raise PushError(f"{root} has no config.json; push uploads a folder written by `attention-seq2seq export`")
    paths = {path.relative_to(root).as_posix(): path for path in sorted(root.glob("**/*")) if path.is_file()}
    kept = filter_repo_objects(paths, ignore_patterns=[*DEFAULT_IGNORE_PATTERNS, *IGNORE_PATTERNS])
    return [UploadFile(relpath, paths[relpath].stat().st_size) for relpath in kept]


def hub_offline_reason(endpoint: str | None = None, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why the Hub cannot be reached now, or None when a TCP connection to it succeeds.

    Checks ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` first (no network then), else opens and
    closes one connection to the endpoint's host, waiting at most ``timeout`` seconds.
    """
    from huggingface_hub import constants

    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return f"{variable}={os.environ[variable]} is set"
    if constants.HF_HUB_OFFLINE:
        return "huggingface_hub is in offline mode"
    url = urlsplit(endpoint or constants.ENDPOINT)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as error:
        return f"cannot connect to {host}:{port} ({error.strerror or type(error).__name__})"


def push_to_hub(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    token: str | None = None,
    dry_run: bool = False,
    commit_message: str = "Upload model exported with attention_seq2seq",
    pin_card: bool = True,
) -> PushResult:
    """Upload ``folder`` to the model repository ``repo_id``; returns what was (or would be) uploaded.

    Args:
        folder: an export folder (it must hold ``config.json``).
        repo_id: ``"user/name"`` or ``"org/name"``.
        private: create the repository as private (an existing repository keeps its visibility).
        revision: the branch to commit to, created from ``main`` if missing; default ``main``.
        token: a Hub token; default ``HF_TOKEN`` or the ``hf auth login`` cache.
        dry_run: only list the files (path and size); no network, no token needed.
        commit_message: the commit's title.
        pin_card: after the upload, commit a ``README.md`` whose ``REVISION = "main"`` placeholder
            names the upload's commit id (a card without the placeholder is left as it is).

    Raises:
        PushError: a bad folder or repo id, offline, no token, or a Hub error, always with a
            one-line message.
    """
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise PushError(f"repo id {repo_id!r} must look like 'user/model-name'")
    files = list_upload_files(folder)
    branch = revision or "main"
    if dry_run:
        return PushResult(repo_id, branch, files, dry_run=True)

    reason = hub_offline_reason()
    if reason is not None:
        raise PushError(f"cannot push to the Hub while offline: {reason}; use --dry-run to list the files")

    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import HfHubHTTPError

    token = token or get_token()
    if not token:
        raise PushError("no Hugging Face token: set HF_TOKEN or run `hf auth login`")
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        if branch != "main":
            api.create_branch(repo_id, branch=branch, repo_type="model", exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            repo_type="model",
            revision=branch,
            commit_message=commit_message,
            ignore_patterns=list(IGNORE_PATTERNS),
        )
        pinned = _pin_card(api, Path(folder), repo_id, branch, getattr(commit, "oid", None)) if pin_card else None
    except HfHubHTTPError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise PushError(f"the Hub refused the upload to {repo_id}: {first_line}") from None
    except Exception as error:  # the HTTP client's transport errors: report in one line, not a traceback
        raise PushError(f"upload to {repo_id} failed: {type(error).__name__}: {error}") from None
    return PushResult(
        repo_id, branch, files, dry_run=False, commit_url=getattr(commit, "commit_url", None), pinned_revision=pinned
    )


def _pin_card(api, folder: Path, repo_id: str, branch: str, oid: str | None) -> str | None:
    """Commit ``folder``'s README.md with its ``REVISION = "main"`` placeholder set to ``oid``
    (the upload's commit); returns ``oid``, or None where there is no placeholder or no id."""
    card = folder / "README.md"
    if not oid or not card.is_file():
        return None
    text = card.read_text(encoding="utf-8")
    pinned = f'REVISION = "{oid}"  # the commit this model was uploaded in; its .py files are listed below'
    text, count = _REVISION_PLACEHOLDER.subn(pinned, text)
    if count == 0:
        return None
    api.upload_file(
        path_or_fileobj=text.encode("utf-8"),
        path_in_repo="README.md",
        repo_id=repo_id,
        repo_type="model",
        revision=branch,
        commit_message=f"Model card: pin REVISION to {oid[:12]}, the upload's commit",
    )
    return oid
