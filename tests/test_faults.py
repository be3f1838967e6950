"""Fault injection (issue 43): what a long training run meets besides its happy path.

Each test makes one fault happen for real to a training process started as a user starts it
(``python -m attention_seq2seq.training.train --recipe ...``) and checks what survives:

- kill -9 at every crash point of a tiny run (:func:`~attention_seq2seq.data.durability.crash_point`:
  updates, inside checkpoint and best-k writes, best-k pruning, the final model, metrics.json, the
  corpus cache build), each followed by ``--resume``: the final weights are bit-identical to an
  uninterrupted run and no partial checkpoint is ever in place;
- two trainings into one output folder (the second refused naming the first), a lock holder
  killed -9 (its lock goes with it), two builders of one cache entry with the first killed -9;
- a full disk (a file-size limit set on the running process) during a checkpoint: one line, the
  previous checkpoint intact, the run resumes to the same weights;
- damaged corpus-cache entries (truncated, bit-flipped, a file missing): rebuilt with one warning;
- a read-only cache directory: the run still trains, with one warning.

The reference runs are module-scoped (one per family, a few seconds each); the kill chains are
``slow`` (a minute or two per family) and still run in CI.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import REPO_ROOT, TINY_TRANSFORMER, free_port, pairs_corpus_spec

from attention_seq2seq.data.durability import (
    KILL_AT_ENV,
    MANIFEST,
    STOP_AT_ENV,
    TRACE_ENV,
    LockedError,
    check_manifest,
    exclusive,
)
from attention_seq2seq.training.config import config_from_dict, dump_recipe
from attention_seq2seq.training.train_config import TrainConfig

FAMILIES = ("transformer", "rnn")
MODEL_CONFIGS = {
    "transformer": {**TINY_TRANSFORMER, "dropout": 0.1},
    "rnn": {
        "embedding_size": 32,
        "hidden_size": 32,
        "attention": "luong",
        "score": "general",
        "input_feeding": True,
        "dropout": 0.1,
    },
}
TIMEOUT_S = 300
STEP = re.compile(r"step_\d+")


def write_recipe(path: Path, family: str, output_dir: Path, **overrides) -> Path:
    """A run of a few seconds that passes every kind of crash point: 6 updates of 2 accumulated
    micro-batches (dropout on, so the RNG state matters), a checkpoint and a validation every 2
    updates, 2 best kept and averaged (so best-k pruning happens), one thread (bit-identical
    between processes)."""
    values = dict(
        model_family=family,
        model_config=MODEL_CONFIGS[family],
        corpus=pairs_corpus_spec(),
        max_train_samples=120,
        vocab_size=500,
        max_source_length=48,
        max_target_length=48,
        max_tokens=400,
        gradient_accumulation_steps=2,
        learning_rate=3e-3,
        warmup_steps=2,
        max_steps=6,
        eval_every=2,
        save_every=2,
        keep_best_k=2,
        average_best_k=2,
        max_eval_samples=8,
        eval_num_beams=2,
        eval_batch_size=8,
        max_test_samples=8,
        test_num_beams=2,
        num_plot_sentences=1,
        log_every=1,
        log_with="none",
        num_threads=1,
        mixed_precision="no",
        output_dir=str(output_dir),
    )
    values.update(overrides)
    dump_recipe(config_from_dict(TrainConfig, values), path)
    return path


def child_env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (KILL_AT_ENV, STOP_AT_ENV, TRACE_ENV)}
    env.update(ATTENTION_SEQ2SEQ_CACHE=str(cache), OMP_NUM_THREADS="1", **extra)
    env.pop("ATTENTION_SEQ2SEQ_DEBUG", None)
    return env


def train_command(recipe: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "attention_seq2seq.training.train", "--recipe", str(recipe), *args]


def run_train(recipe: Path, cache: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        train_command(recipe, *args),
        cwd=REPO_ROOT,
        env=child_env(cache, **extra),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def start_train(recipe: Path, cache: Path, *args: str, **extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        train_command(recipe, *args),
        cwd=REPO_ROOT,
        env=child_env(cache, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_stopped(proc: subprocess.Popen, timeout: float = TIMEOUT_S) -> None:
    """Wait until ``proc`` has stopped itself (SIGSTOP at its ``STOP_AT`` crash point)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            state = "gone"
        if state == "T":
            return
        if proc.poll() is not None:
            tail = proc.stderr.read()[-3000:]
            raise AssertionError(f"the run ended ({proc.returncode}) before its stop point: {tail}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the run never reached its stop point")


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


class Reference:
    """An uninterrupted run of one family, its crash points in order, and the tokenizer every
    other run of the family reuses (subword training is not bitwise reproducible)."""

    def __init__(self, root: Path, family: str):
        self.family = family
        first = run_train(write_recipe(root / "first.yaml", family, root / "first"), root / "cache-first")
        assert first.returncode == 0, first.stderr[-3000:]
        self.tokenizer = root / "tokenizer"
        shutil.copytree(root / "first" / "model", self.tokenizer, ignore=shutil.ignore_patterns("*.safetensors"))
        self.dir = root / "ref" / "run"
        trace = root / "trace.txt"
        recipe = write_recipe(root / "ref.yaml", family, self.dir, tokenizer_path=str(self.tokenizer))
        done = run_train(recipe, root / "cache-ref", **{TRACE_ENV: str(trace)})
        assert done.returncode == 0, done.stderr[-3000:]
        self.points = trace.read_text().splitlines()

    def recipe(self, path: Path, output_dir: Path) -> Path:
        """The reference's recipe for another output folder (named ``run`` too: crash points name
        the folder they write in)."""
        assert output_dir.name == "run"
        return write_recipe(path, self.family, output_dir, tokenizer_path=str(self.tokenizer))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    made: dict[str, Reference] = {}

    def get(family: str) -> Reference:
        if family not in made:
            made[family] = Reference(tmp_path_factory.mktemp(f"reference-{family}"), family)
        return made[family]

    return get


def bytes_of(path: Path) -> bytes:
    return path.read_bytes()


def assert_nothing_partial(run: Path, ref: Path) -> None:
    """Every folder under a final name is whole: checkpoints and best-k folders (and model/, and
    metrics.json) either absent or equal to the uninterrupted run's where it kept them, and
    readable where it pruned them."""
    for sub, files in (("checkpoints", ("model.safetensors", "optimizer.bin")), ("best", ("model.safetensors",))):
        for folder in sorted((run / sub).glob("step_*")) if (run / sub).is_dir() else []:
            assert STEP.fullmatch(folder.name), folder
            twin = ref / sub / folder.name
            for name in files:
                if twin.is_dir():
                    assert bytes_of(folder / name) == bytes_of(twin / name), f"{folder / name} differs"
                elif name.endswith(".safetensors"):
                    load_file(str(folder / name))
                else:
                    torch.load(folder / name, weights_only=False)
            if sub == "checkpoints":
                state = torch.load(folder / "training_state.pt", weights_only=False)
                assert state["trainer"]["step"] == int(folder.name.split("_")[1])
    if (run / "model" / "model.safetensors").exists():
        assert bytes_of(run / "model" / "model.safetensors") == bytes_of(ref / "model" / "model.safetensors")
    if (run / "model").is_dir():
        assert (run / "model" / "tokenizer.json").exists(), "model/ without its tokenizer"
    if (run / "metrics.json").exists():
        ours, theirs = (json.loads((r / "metrics.json").read_text()) for r in (run, ref))
        assert ours["test"] == theirs["test"]


def assert_same_run(run: Path, ref: Path) -> None:
    """The finished run equals the uninterrupted one: final model, kept checkpoints and best-k
    folders byte for byte, validation and test scores."""
    assert bytes_of(run / "model" / "model.safetensors") == bytes_of(ref / "model" / "model.safetensors")
    for sub in ("checkpoints", "best"):
        names = sorted(p.name for p in (run / sub).iterdir() if not p.name.startswith("."))
        assert names == sorted(p.name for p in (ref / sub).iterdir() if not p.name.startswith("."))
        for name in names:
            assert bytes_of(run / sub / name / "model.safetensors") == bytes_of(ref / sub / name / "model.safetensors")
    ours, theirs = (json.loads((r / "metrics.json").read_text()) for r in (run, ref))
    assert ours["validation"] == theirs["validation"]
    assert ours["test"] == theirs["test"]
    assert ours["train"]["steps"] == theirs["train"]["steps"] == 6
    assert not [p for sub in ("checkpoints", "best") for p in (run / sub).iterdir() if p.name.startswith(".")]


# ------------------------------------------------------------------------------ kill -9, resume
@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_kill_9_at_every_crash_point_and_resume_gives_the_uninterrupted_weights(family, reference, tmp_path):
    ref = reference(family)
    points = ref.points
    kinds = {
        "updates": [p for p in points if p.startswith("update ")],
        "checkpoint writes": [p for p in points if p.startswith("checkpoints/") and "deleted" not in p],
        "best-k writes": [p for p in points if p.startswith("best/") and "deleted" not in p],
        "pruning": [p for p in points if p.endswith("being deleted")],
        "final model": [p for p in points if p.startswith("run/model") or p == "model weights written"],
        "metrics.json": [p for p in points if p.startswith("metrics.json")],
        "corpus cache": [p for p in points if p.startswith("corpus cache")],
    }
    assert len(points) >= 20 and all(kinds.values()), kinds
    run, cache = tmp_path / "chain" / "run", tmp_path / "cache"
    recipe = ref.recipe(tmp_path / "recipe.yaml", run)
    for point in points:  # each run resumes the killed one and dies at the next point
        killed = run_train(recipe, cache, "--resume", **{KILL_AT_ENV: point})
        assert killed.returncode == -signal.SIGKILL, f"{point!r} not reached: {killed.stderr[-3000:]}"
        assert_nothing_partial(run, ref.dir)
    done = run_train(recipe, cache, "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_run(run, ref.dir)


# ------------------------------------------------------------------------ two processes, one place
def test_a_second_training_into_the_same_folder_is_refused_naming_the_first(reference, tmp_path):
    ref = reference("transformer")
    run, cache = tmp_path / "one" / "run", tmp_path / "cache"
    recipe = ref.recipe(tmp_path / "recipe.yaml", run)
    first = start_train(recipe, cache, **{STOP_AT_ENV: "checkpoints/step_2 renamed"})
    try:
        wait_stopped(first)
        second = run_train(recipe, cache, "--resume")
        assert second.returncode == 2
        (line,) = error_lines(second.stderr)
        assert f"process {first.pid} on " in line and "train" in line and str(run) in line, line
        assert [p.name for p in (run / "checkpoints").glob("step_*")] == ["step_2"]  # nothing touched
    finally:
        first.kill()  # kill -9 while holding the lock: the kernel drops it
        first.communicate()
    assert (run / ".train.lock").exists()  # the stale lock file blocks nobody
    done = run_train(recipe, cache, "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_run(run, ref.dir)


def test_exclusive_refuses_a_live_holder_and_not_a_dead_one(tmp_path):
    lock = tmp_path / "x.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from attention_seq2seq.data.durability import exclusive\n"
            f"with exclusive({str(lock)!r}, 'the place'):\n    print('held', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockedError, match=rf"the place is in use by process {holder.pid} on .* \(since "):
            with exclusive(lock, "the place"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with exclusive(lock, "the place"):  # the dead holder's lock is gone
        assert json.loads(lock.read_text())["pid"] == os.getpid()


def test_two_builders_of_one_cache_entry_build_it_once_when_the_first_is_killed(tmp_path):
    from attention_seq2seq.data.prepared import build_once

    final = tmp_path / "cache" / "entry"
    script = (
        "import sys\nfrom pathlib import Path\nfrom attention_seq2seq.data.prepared import build_once\n"
        "def build(tmp):\n    (tmp / 'data.bin').write_bytes(b'x' * 1000)\n"
        f"print(build_once(Path({str(final)!r}), build))"
    )
    first = subprocess.Popen(
        [sys.executable, "-c", script],
        env={**os.environ, STOP_AT_ENV: "corpus cache entry built, not yet renamed"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_stopped(first)
        assert not final.exists() and list(final.parent.glob(".entry.tmp-*"))  # caught mid-build
        second = subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        time.sleep(2)
        assert second.poll() is None  # waits on the builder's lock
    finally:
        first.kill()
        first.communicate()
    out, err = second.communicate(timeout=TIMEOUT_S)
    assert second.returncode == 0, err
    assert out.strip() == "True"  # the second built it, once
    assert check_manifest(final) is None and (final / "data.bin").read_bytes() == b"x" * 1000
    # the killed builder's temporary folder is gone
    assert sorted(p.name for p in final.parent.iterdir()) == ["entry", "entry.lock"]
    assert build_once(final, lambda tmp: pytest.fail("built again")) is False


# --------------------------------------------------------------------------------- a full disk
@pytest.mark.parametrize(
    "stop_at, written, kept",
    [  # the validation of update 4 writes best/step_4 first (then checkpoints/step_4)
        ("checkpoints/step_2 renamed", "best/step_4", "the previous best/step_2 is intact"),
        ("checkpoints/step_6 renamed", "run/model", "the checkpoints are intact: --resume writes it"),
    ],
    ids=["checkpoint", "final model"],
)
def test_a_full_disk_during_a_save_is_one_line_and_the_run_resumes(reference, tmp_path, stop_at, written, kept):
    ref = reference("transformer")
    run, cache = tmp_path / "full" / "run", tmp_path / "cache"
    recipe = ref.recipe(tmp_path / "recipe.yaml", run)
    proc = start_train(recipe, cache, **{STOP_AT_ENV: stop_at})
    try:
        wait_stopped(proc)
        before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and "step_" in str(p)}
        # 64 kB per file from now on: small files still fit, a model's weights do not.
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (64_000, 64_000))
        os.kill(proc.pid, signal.SIGCONT)
        _, stderr = proc.communicate(timeout=TIMEOUT_S)
    finally:
        proc.kill()
    assert proc.returncode == 2, stderr[-3000:]
    assert len(error_lines(stderr)) == 1, stderr[-3000:]
    (line,) = error_lines(stderr)
    folder = run / written.removeprefix("run/")
    assert line.startswith(f"error: no space left writing {written} ({folder}: "), line
    assert "a file-size limit of 64.0 kB (ulimit -f)" in line and line.endswith(f"; {kept}"), line
    assert "Traceback" not in stderr
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and "step_" in str(p)}
    if written == "run/model":  # update 6 pruned the checkpoint of update 2 before the final save
        before = {k: v for k, v in before.items() if not str(k).startswith("checkpoints/step_2/")}
    assert after == before  # the partial folder is gone, every earlier one untouched
    assert_nothing_partial(run, ref.dir)
    done = run_train(recipe, cache, "--resume")  # space back (no limit): the run goes on
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_run(run, ref.dir)


# ------------------------------------------------------------------------------ rotten caches
def _damage(entry: Path, how: str) -> None:
    files = [p for p in entry.rglob("*") if p.is_file() and p.name != MANIFEST]
    victim = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    if how == "truncated":
        victim.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "bit-flipped":
        data[len(data) // 3] ^= 0x10
        victim.write_bytes(bytes(data))
    else:
        victim.unlink()


@pytest.mark.parametrize("how", ["truncated", "bit-flipped", "missing a file"])
def test_a_damaged_corpus_cache_entry_is_rebuilt_with_one_warning(reference, tmp_path, how):
    ref = reference("transformer")
    cache = tmp_path / "cache"
    done = run_train(ref.recipe(tmp_path / "a.yaml", tmp_path / "a" / "run"), cache)
    assert done.returncode == 0, done.stderr[-3000:]
    (entry,) = [p for p in cache.rglob("prepared-*") if p.is_dir()]
    assert check_manifest(entry) is None
    _damage(entry, how)
    assert check_manifest(entry) is not None
    again = run_train(ref.recipe(tmp_path / "b.yaml", tmp_path / "b" / "run"), cache)
    assert again.returncode == 0, again.stderr[-3000:]
    warnings = [line for line in again.stderr.splitlines() if "is damaged" in line]
    assert len(warnings) == 1 and entry.name in warnings[0], again.stderr[-3000:]
    assert "Traceback" not in again.stderr
    assert check_manifest(entry) is None
    assert_same_run(tmp_path / "b" / "run", ref.dir)  # the same batches as with a sound entry


# ------------------------------------------------------------------------------ read-only places
def _read_only_prefix(folder: Path) -> list[str]:
    """A command prefix that runs its command with ``folder`` read-only: a read-only bind mount in
    a private mount namespace (root passes permission bits), or plain permissions otherwise."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return []
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount --bind -o ro {folder} {folder} && ! touch {folder}/probe"],
        capture_output=True,
    )
    if probe.returncode != 0 or not shutil.which("unshare"):
        pytest.skip(f"no read-only mount for root here (unshare -m: {probe.stderr.decode().strip()[:200]})")
    return ["unshare", "-m", "sh", "-c", f'mount --bind -o ro "{folder}" "{folder}" && exec "$@"', "sh"]


def test_training_with_a_read_only_cache_still_works_with_one_warning(reference, tmp_path):
    ref = reference("transformer")
    cache = tmp_path / "cache"
    cache.mkdir()
    run = tmp_path / "ro" / "run"
    recipe = ref.recipe(tmp_path / "recipe.yaml", run)
    try:
        done = subprocess.run(
            _read_only_prefix(cache) + train_command(recipe),
            cwd=REPO_ROOT,
            env=child_env(cache),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    finally:
        cache.chmod(0o755)
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if "cannot be written" in line]
    assert len(warnings) == 1 and str(cache) in warnings[0] and "ATTENTION_SEQ2SEQ_CACHE" in warnings[0]
    assert list(cache.iterdir()) == []
    assert_same_run(run, ref.dir)


# ----------------------------------------------------------------------------- translate -o
TRANSLATE_OPTIONS = ["--greedy", "--max-new-tokens", "12", "--no-progress", "--chunk-lines", "20"]


@pytest.fixture(scope="module")
def translation_job(tmp_path_factory):
    """A tiny RNN model folder, 100 source lines and their uninterrupted translation (bytes)."""
    from helpers import build_tiny_run, read_pairs

    root = tmp_path_factory.mktemp("translate-faults")
    model = build_tiny_run("rnn_seq2seq", root)
    source = root / "in.txt"
    source.write_text("".join(s + "\n" for s, _ in read_pairs(100, split="train")), encoding="utf-8")
    command = [sys.executable, "-m", "attention_seq2seq.translate", "-m", str(model), "-i", str(source)]
    command += TRANSLATE_OPTIONS
    full = root / "full.txt"
    subprocess.run([*command, "-o", str(full)], check=True, env=child_env(root / "cache"), timeout=TIMEOUT_S)
    return command, full.read_bytes(), root / "cache"


def _start(command: list[str], cache: Path, **extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        command, env=child_env(cache, **extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_second_translate_resume_on_the_same_output_is_refused_naming_the_first(translation_job, tmp_path):
    command, full, cache = translation_job
    out = tmp_path / "out.txt"
    first = _start([*command, "-o", str(out)], cache, **{STOP_AT_ENV: "translations chunk 1 written"})
    try:
        wait_stopped(first)
        before = out.read_bytes()
        second = subprocess.run(
            [*command, "-o", str(out), "--resume"], env=child_env(cache), capture_output=True, text=True
        )
        assert second.returncode == 2
        (line,) = [entry for entry in second.stderr.splitlines() if "error:" in entry]
        assert f"the output file {out} is in use by process {first.pid} on " in line, line
        assert out.read_bytes() == before  # the second wrote nothing
    finally:
        first.kill()
        first.communicate()
    assert before.count(b"\n") == 40  # two chunks of 20 were complete when it was caught
    done = subprocess.run([*command, "-o", str(out), "--resume"], env=child_env(cache), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == full


def test_a_full_disk_during_translate_is_one_line_and_resume_completes_the_file(translation_job, tmp_path):
    command, full, cache = translation_job
    out = tmp_path / "out.txt"
    proc = _start([*command, "-o", str(out)], cache, **{STOP_AT_ENV: "translations chunk 1 written"})
    try:
        wait_stopped(proc)
        written = out.stat().st_size
        # Room for a few more bytes only: the next chunk is cut mid-line.
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (written + 50, written + 50))
        os.kill(proc.pid, signal.SIGCONT)
        _, stderr = proc.communicate(timeout=TIMEOUT_S)
    finally:
        proc.kill()
    assert proc.returncode == 2, stderr
    (line,) = [entry for entry in stderr.splitlines() if "error:" in entry]
    assert f"no space left writing the translations ({out}: " in line, line
    kept = out.read_bytes()
    assert kept.startswith(full[:written]) and len(kept) == written + 50  # what was complete is intact
    # the count is what the file holds: the two chunks, and the lines of the third that fit in 50 bytes
    held = kept.count(b"\n")
    assert held > 40 and not kept.endswith(b"\n")  # cut mid-line
    assert line.endswith(f"it holds {held} complete source(s); rerun with --resume once there is space"), line
    assert "Traceback" not in stderr
    done = subprocess.run([*command, "-o", str(out), "--resume"], env=child_env(cache), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == full


# ------------------------------------------------------------------------ read-only HOME, Hub user
def test_a_read_only_home_still_translates_evaluates_and_loads_from_the_hub_folder(tmp_path):
    from helpers import build_tiny_run, read_pairs

    from attention_seq2seq.hub.export import export_model

    run = build_tiny_run("transformer_seq2seq", tmp_path)
    export_model(run, tmp_path / "hub", repo_id="someone/tiny")
    pairs = read_pairs(5, split="test")
    (tmp_path / "src.txt").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    (tmp_path / "ref.txt").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    home = tmp_path / "home"
    home.mkdir()
    unset = ("XDG_CACHE_HOME", "ATTENTION_SEQ2SEQ_CACHE", "HF_HOME", "HF_MODULES_CACHE", "HF_DATASETS_CACHE")
    env = {k: v for k, v in child_env(tmp_path).items() if k not in unset}
    env.update(HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    load = (
        "import sys\nfrom transformers import AutoModelForSeq2SeqLM, AutoTokenizer\n"
        "folder, remote = sys.argv[1], sys.argv[2] == 'remote'\n"
        "if not remote:\n    import attention_seq2seq\n"
        "model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=remote)\n"
        "tok = AutoTokenizer.from_pretrained(folder)\n"
        "out = model.generate(**tok(['Ein Hund.'], return_tensors='pt'), max_new_tokens=5)\n"
        "print('LOADED', type(model).__module__.split('.')[0], len(tok.batch_decode(out)))"
    )
    py = sys.executable
    commands = {
        "translate": [py, "-m", "attention_seq2seq.translate", "-m", str(run), "--greedy", "Ein Hund."],
        "evaluate": [py, "-m", "attention_seq2seq.cli", "evaluate", "-m", str(run), "--src", str(tmp_path / "src.txt")]
        + ["--ref", str(tmp_path / "ref.txt"), "--greedy", "--max-new-tokens", "8", "--no-progress"],
        "package": [py, "-c", load, str(tmp_path / "hub"), "package"],
        "remote code": [py, "-c", load, str(tmp_path / "hub"), "remote"],
    }
    for name, command in commands.items():
        extra = {}
        if name == "remote code":  # transformers copies remote code into HF_MODULES_CACHE (~/.cache by default)
            extra = {"HF_MODULES_CACHE": str(tmp_path / "modules")}
        done = subprocess.run(
            _read_only_prefix(home) + command,
            env={**env, **extra},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=TIMEOUT_S,
        )
        assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr, name
        if name in ("package", "remote code"):
            assert "LOADED" in done.stdout, done.stdout
    assert list(home.iterdir()) == []  # nothing was written there


# ------------------------------------------------------------------------------ a rank dies
def _launch(
    recipe: Path, cache: Path, *launch_args: str, extra_env: dict | None = None, train_args: tuple[str, ...] = ()
) -> subprocess.Popen:
    accelerate = Path(sys.executable).with_name("accelerate")
    command = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", *launch_args]
    command += ["-m", "attention_seq2seq.training.train", "--recipe", str(recipe), "--resume", *train_args]
    env = child_env(cache, TOKENIZERS_PARALLELISM="false", **(extra_env or {}))
    return subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen, timeout: float = TIMEOUT_S) -> tuple[int, str]:
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        raise AssertionError(f"still running after {timeout} s: {stderr[-3000:]}") from None
    return proc.returncode, stderr


@pytest.mark.slow
def test_a_killed_rank_stops_the_other_at_once_and_the_run_resumes(reference, tmp_path):
    ref = reference("transformer")
    port = ["--main_process_port"]
    # The two-rank reference: uninterrupted.
    whole = ref.recipe(tmp_path / "whole.yaml", tmp_path / "whole" / "run")
    code, stderr = _finish(_launch(whole, tmp_path / "cache", *port, str(free_port())))
    assert code == 0 and "world size 2" in stderr, stderr[-3000:]
    # Rank 1 killed -9 after update 3 (the checkpoint of update 2 is on disk).
    run = tmp_path / "killed" / "run"
    recipe = ref.recipe(tmp_path / "killed.yaml", run)
    fault = {"ATTENTION_SEQ2SEQ_FAULT_RANK": "1", KILL_AT_ENV: "update 3"}
    started = time.monotonic()
    code, stderr = _finish(_launch(recipe, tmp_path / "cache", *port, str(free_port()), extra_env=fault), timeout=120)
    assert code != 0 and time.monotonic() - started < 120
    # Rank 0 stops either way: its next collective fails (one line, exit 3), or the launcher, which
    # saw rank 1 die first, ends it with SIGTERM (a race the scheduler decides).
    lines = [line for line in stderr.splitlines() if "error: rank 0 of 2 lost contact with another rank" in line]
    terminated = re.search(r"rank\s*: 0 \(local_rank: 0\)\s+exitcode\s*: -15", stderr)
    assert len(lines) == 1 or (not lines and terminated), stderr[-4000:]
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)\s+exitcode\s*: -9", stderr), stderr[-3000:]  # the launcher names it
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2"]
    code, stderr = _finish(_launch(recipe, tmp_path / "cache", *port, str(free_port())))
    assert code == 0, stderr[-3000:]
    assert_same_run(run, tmp_path / "whole" / "run")


def test_a_lost_rank_is_one_line_for_a_dead_peer_and_for_an_expired_wait_and_only_with_several_ranks(monkeypatch):
    from attention_seq2seq.training.train import lost_rank_message

    reset = RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242")
    expired = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 15000ms for recv operation")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert lost_rank_message(reset, 15) is None and lost_rank_message(expired, 15) is None
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert lost_rank_message(reset, 15).startswith("rank 0 of 2 lost contact with another rank, which stopped")
    assert lost_rank_message(expired, 15).startswith("rank 0 of 2 waited 15 s (ddp_timeout) for another rank")
    assert lost_rank_message(RuntimeError("CUDA out of memory"), 15) is None  # not a lost rank: its own traceback


@pytest.mark.slow
def test_a_hung_rank_stops_the_other_after_ddp_timeout_not_torchs_thirty_minutes(reference, tmp_path):
    ref = reference("transformer")
    run = tmp_path / "hung" / "run"
    recipe = ref.recipe(tmp_path / "hung.yaml", run)
    # Rank 1 stops itself (SIGSTOP: alive, silent, as a stuck process or a frozen machine is) after update 3.
    fault = {"ATTENTION_SEQ2SEQ_FAULT_RANK": "1", STOP_AT_ENV: "update 3"}
    proc = _launch(
        recipe,
        tmp_path / "cache",
        "--main_process_port",
        str(free_port()),
        extra_env=fault,
        train_args=("--ddp_timeout", "15"),
    )
    code, stderr = _finish(proc, timeout=300)  # far inside torch's default of 1800 s
    assert code != 0
    lines = [line for line in stderr.splitlines() if line.startswith("error: rank 0 of 2 waited 15 s (ddp_timeout)")]
    assert len(lines) == 1, stderr[-4000:]
    assert "start the same launch with --resume" in lines[0]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2"]


@pytest.mark.slow
def test_two_machines_on_the_loopback_train_the_weights_of_one_machine_with_two_processes(reference, tmp_path):
    ref = reference("transformer")
    one = ref.recipe(tmp_path / "one.yaml", tmp_path / "one" / "run")
    code, stderr = _finish(_launch(one, tmp_path / "cache", "--main_process_port", str(free_port())))
    assert code == 0, stderr[-3000:]
    two = ref.recipe(tmp_path / "two.yaml", tmp_path / "two" / "run")
    port = str(free_port())
    machines = [
        _launch(
            two,
            tmp_path / "cache",
            "--num_machines",
            "2",
            "--machine_rank",
            str(rank),
            "--main_process_ip",
            "127.0.0.1",
            "--main_process_port",
            port,
        )
        for rank in (0, 1)
    ]
    results = [_finish(proc) for proc in machines]
    for code, stderr in results:
        assert code == 0, stderr[-3000:]
    assert "world size 2" in results[0][1]
    assert json.loads((tmp_path / "two" / "run" / "metrics.json").read_text())["train"]["world_size"] == 2
    assert_same_run(tmp_path / "two" / "run", tmp_path / "one" / "run")


def test_a_full_disk_while_building_a_cache_entry_is_one_line_and_leaves_nothing_half_built(tmp_path):
    final = tmp_path / "cache" / "entry"
    script = (
        "import resource, sys\nfrom pathlib import Path\nfrom attention_seq2seq.data.prepared import build_once\n"
        "from attention_seq2seq.data.durability import DiskFullError\n"
        "if sys.argv[1] == 'limited':\n    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))\n"
        "def build(tmp):\n    (tmp / 'small.bin').write_bytes(b's' * 10)\n"
        "    (tmp / 'big.bin').write_bytes(b'b' * 500_000)\n"
        "try:\n    print(build_once(Path(sys.argv[2]), build))\n"
        "except DiskFullError as err:\n    print('error:', err)\n"
    )
    full = subprocess.run([sys.executable, "-c", script, "limited", str(final)], capture_output=True, text=True)
    (line,) = full.stdout.splitlines()
    assert line.startswith(f"error: no space left writing the corpus cache entry ({final.parent}: "), line
    assert "file-size limit of 100.0 kB" in line and line.endswith("nothing half-built is left in the cache"), line
    assert sorted(p.name for p in final.parent.iterdir()) == ["entry.lock"]
    again = subprocess.run([sys.executable, "-c", script, "free", str(final)], capture_output=True, text=True)
    assert again.stdout.strip() == "True", again.stderr
    assert check_manifest(final) is None and (final / "big.bin").stat().st_size == 500_000


# ------------------------------------------------------------------------------ remote code, safely
def test_the_export_card_pins_a_revision_and_lists_the_sha256_of_every_shipped_py_file(tmp_path):
    import hashlib

    from helpers import build_tiny_run

    from attention_seq2seq.hub.export import export_model

    out = export_model(build_tiny_run("rnn_seq2seq", tmp_path), tmp_path / "hub", repo_id="someone/tiny")
    card = (out / "README.md").read_text(encoding="utf-8")
    loads = [line for line in card.splitlines() if "trust_remote_code=True)" in line]
    assert len(loads) >= 3 and all("revision=REVISION" in line for line in loads), loads
    assert 'REVISION = "main"  # replace with the commit id you reviewed' in card
    table = dict(re.findall(r"^\| `([^`]+\.py)` \| `([0-9a-f]{64})` \|$", card, flags=re.M))
    shipped = {p.relative_to(out).as_posix(): p for p in out.rglob("*.py")}
    assert len(shipped) >= 3 and table.keys() == shipped.keys()
    for name, path in shipped.items():
        digest = hashlib.sha256()
        digest.update(path.read_bytes())
        assert table[name] == digest.hexdigest(), name


@pytest.mark.parametrize("command", ["translate", "evaluate", "demo"])
def test_the_revision_help_says_why_to_pin_it_with_remote_code(command, capsys):
    from attention_seq2seq.cli import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--trust-remote-code pin a commit whose .py files you have read" in text, text


def test_a_full_disk_during_export_is_one_line_and_keeps_the_earlier_export(tmp_path):
    from helpers import build_tiny_run

    run = build_tiny_run("transformer_seq2seq", tmp_path)
    out = tmp_path / "hub"
    script = (
        "import resource, sys\nfrom attention_seq2seq.cli import main\n"
        "if sys.argv[1] == 'limited':\n    resource.setrlimit(resource.RLIMIT_FSIZE, (64_000, 64_000))\n"
        "sys.exit(main(sys.argv[2:]))"
    )
    argv = ["export", str(run), "-o", str(out), "--repo-id", "someone/tiny"]
    first = subprocess.run([sys.executable, "-c", script, "free", *argv], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    full = subprocess.run(
        [sys.executable, "-c", script, "limited", *argv, "--overwrite"], capture_output=True, text=True
    )
    assert full.returncode == 2, full.stderr[-3000:]
    (line,) = [entry for entry in full.stderr.splitlines() if "error:" in entry]
    assert f"no space left writing the export ({out}: " in line and "file-size limit of 64.0 kB" in line, line
    assert line.endswith("an earlier export there is intact"), line
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".hub")) == []  # no staging left


# ------------------------------------------------------------------------------ hostile files
HOSTILE = {
    "invalid UTF-8": (
        b"Ein Hund.\nEin \xff Haus.\n",
        "line 2: not UTF-8 (byte 0xff at column 5); save the file as UTF-8",
    ),
    "NUL byte": (b"Ein Hund.\nEin\x00Haus.\n", "line 2: a NUL byte at column 4 (a binary or UTF-16 file?)"),
}
BENIGN = {"CRLF": b"Ein Hund.\r\nEine Katze.\r\n", "BOM": b"\xef\xbb\xbfEin Hund.\nEine Katze.\n"}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_text_readers_name_the_file_and_line_of_a_hostile_line(tmp_path, name):
    from attention_seq2seq.data.corpora import load_corpus
    from attention_seq2seq.data.spec import CorpusError, text_lines

    data, message = HOSTILE[name]
    bad = tmp_path / "bad.de"
    bad.write_bytes(data)
    with pytest.raises(CorpusError) as caught:
        list(text_lines(bad))
    assert str(caught.value) == f"{bad} {message}" or str(caught.value).startswith(f"{bad} {message}")
    # through the corpus reader of line-aligned files (text:DIR:de-en)
    for split in ("train", "validation", "test"):
        (tmp_path / f"{split}.de").write_bytes(data if split == "train" else b"Ein Hund.\n")
        (tmp_path / f"{split}.en").write_bytes(b"A dog.\nA house.\n" if split == "train" else b"A dog.\n")
    with pytest.raises(CorpusError, match=re.escape(f"train.de {message}")):
        load_corpus(f"text:{tmp_path}:de-en")


@pytest.mark.parametrize("name", sorted(BENIGN))
def test_crlf_and_a_bom_give_the_lines_of_the_clean_file(tmp_path, name):
    from attention_seq2seq.data.spec import text_lines

    path = tmp_path / "in.txt"
    path.write_bytes(BENIGN[name])
    assert list(text_lines(path)) == ["Ein Hund.", "Eine Katze."]


def test_a_10_mb_line_and_an_empty_file_are_read(tmp_path):
    from attention_seq2seq.data.spec import text_lines

    big = tmp_path / "big.txt"
    big.write_bytes(b"Hund " * 2_000_000 + b"\nEnde\n")
    lines = list(text_lines(big))
    assert len(lines) == 2 and lines[0] == "Hund " * 2_000_000 and lines[1] == "Ende"
    (tmp_path / "empty.txt").write_bytes(b"")
    assert list(text_lines(tmp_path / "empty.txt")) == []


@pytest.fixture(scope="module")
def tiny_model_folder(tmp_path_factory):
    from helpers import build_tiny_run

    return build_tiny_run("rnn_seq2seq", tmp_path_factory.mktemp("hostile"))


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_translate_and_evaluate_refuse_a_hostile_input_in_one_line(tiny_model_folder, tmp_path, capsys, name):
    from attention_seq2seq.cli import main

    data, message = HOSTILE[name]
    bad = tmp_path / "in.txt"
    bad.write_bytes(data)
    ref = tmp_path / "ref.txt"
    ref.write_text("A dog.\nA house.\n", encoding="utf-8")
    options = ["--greedy", "--max-new-tokens", "4", "--no-progress"]
    assert main(["translate", "-m", str(tiny_model_folder), "-i", str(bad), "-o", str(tmp_path / "o"), *options]) == 2
    assert main(["evaluate", "-m", str(tiny_model_folder), "--src", str(bad), "--ref", str(ref), *options]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 2 and all(line.endswith(f"{bad} {message}") or f"{bad} {message}" in line for line in errors)


@pytest.mark.parametrize("same_as", ["--input", "--output"])
def test_alignments_never_overwrite_the_input_nor_share_the_output(tiny_model_folder, tmp_path, capsys, same_as):
    from attention_seq2seq.cli import main

    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("Ein Hund.\nEin Haus.\n", encoding="utf-8")
    target = source if same_as == "--input" else output
    argv = ["translate", "-m", str(tiny_model_folder), "-i", str(source), "-o", str(output), "--alignments"]
    assert main([*argv, str(target), "--greedy", "--max-new-tokens", "4", "--no-progress"]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert f"--alignments is the {same_as} file" in line
    assert source.read_text(encoding="utf-8") == "Ein Hund.\nEin Haus.\n" and not output.exists()


def test_evaluate_refuses_mismatched_line_counts_naming_both_files(tiny_model_folder, tmp_path, capsys):
    from attention_seq2seq.cli import main

    (tmp_path / "src.txt").write_text("Ein Hund.\nEine Katze.\nEin Haus.\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("A dog.\n", encoding="utf-8")
    argv = ["evaluate", "-m", str(tiny_model_folder), "--src", str(tmp_path / "src.txt")]
    assert main([*argv, "--ref", str(tmp_path / "ref.txt"), "--greedy", "--no-progress"]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert "--src has 3 lines but --ref has 1" in line and "src.txt" in line and "ref.txt" in line


def _one_error_of(err: str) -> str:
    (line,) = [line for line in err.splitlines() if "error:" in line]
    return line


def _one_error(capsys) -> str:
    return _one_error_of(capsys.readouterr().err)


_QUICK = ["--greedy", "--max-new-tokens", "4", "--no-progress"]


def _test_files(tmp_path: Path) -> tuple[Path, Path]:
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("Ein Hund.\nEin Haus.\n", encoding="utf-8")
    ref.write_text("A dog.\nA house.\n", encoding="utf-8")
    return src, ref


@pytest.mark.parametrize("option", ["--output", "--hypotheses", "--per-sentence"])
@pytest.mark.parametrize("same_as", ["--src", "--ref"])
def test_evaluate_never_writes_over_its_test_set(tiny_model_folder, tmp_path, capsys, option, same_as):
    from attention_seq2seq.cli import main

    src, ref = _test_files(tmp_path)
    target = src if same_as == "--src" else ref
    argv = ["evaluate", "-m", str(tiny_model_folder), "--src", str(src), "--ref", str(ref), option, str(target)]
    assert main([*argv, *_QUICK]) == 2
    assert f"{option} is the {same_as} file" in _one_error(capsys)
    assert src.read_text(encoding="utf-8") == "Ein Hund.\nEin Haus.\n"
    assert ref.read_text(encoding="utf-8") == "A dog.\nA house.\n"


@pytest.mark.parametrize(
    "command,option",
    [
        ("translate", "--output"),
        ("translate", "--alignments"),
        ("evaluate", "--output"),
        ("evaluate", "--hypotheses"),
        ("evaluate", "--per-sentence"),
    ],
)
def test_an_output_that_is_a_folder_is_one_line_and_leaves_it_as_it_was(
    tiny_model_folder, tmp_path, capsys, command, option
):
    from attention_seq2seq.cli import main

    src, ref = _test_files(tmp_path)
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "kept.txt").write_text("kept\n", encoding="utf-8")
    files = ["-i", str(src)] if command == "translate" else ["--src", str(src), "--ref", str(ref)]
    extra = ["-o", str(tmp_path / "out.txt")] if option == "--alignments" else []
    assert main([command, "-m", str(tiny_model_folder), *files, *extra, option, str(folder), *_QUICK]) == 2
    assert f"{option} {folder} is a folder; give a file name" in _one_error(capsys)
    assert sorted(p.name for p in folder.iterdir()) == ["kept.txt"]  # no temporary file left in it


def test_an_input_that_is_not_a_file_says_what_it_is(tiny_model_folder, tmp_path, capsys):
    from attention_seq2seq.cli import main

    src, ref = _test_files(tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    cases = {
        str(tmp_path): "is a folder",
        str(fifo): "is a named pipe, not a file",
        os.devnull: "is a character device, not a file",
        "-": "give a file name; to read standard input, leave out --input",
        str(tmp_path / "missing.txt"): "file not found",
    }
    for path, message in cases.items():
        out = tmp_path / "out.txt"
        out.write_text("kept\n", encoding="utf-8")
        assert main(["translate", "-m", str(tiny_model_folder), "-i", path, "-o", str(out), *_QUICK]) == 2, path
        line = _one_error(capsys)
        assert "--input" in line and message in line, (path, line)
        assert out.read_text(encoding="utf-8") == "kept\n"
    assert main(["evaluate", "-m", str(tiny_model_folder), "--src", str(src), "--ref", str(tmp_path), *_QUICK]) == 2
    assert f"--ref {tmp_path} is a folder" in _one_error(capsys)


def test_a_bad_line_late_in_the_input_keeps_the_existing_output(tiny_model_folder, tmp_path, capsys):
    from attention_seq2seq.cli import main

    bad = tmp_path / "in.txt"
    bad.write_bytes(b"Ein Hund.\n" * 50 + b"Ein \xff Haus.\n")
    out = tmp_path / "out.txt"
    out.write_text("yesterday's translations\n", encoding="utf-8")
    argv = ["translate", "-m", str(tiny_model_folder), "-i", str(bad), "-o", str(out), "--chunk-lines", "10"]
    assert main([*argv, *_QUICK]) == 2
    assert f"{bad} line 51: not UTF-8 (byte 0xff at column 5)" in _one_error(capsys)
    assert out.read_text(encoding="utf-8") == "yesterday's translations\n"


def test_a_bad_line_on_standard_input_is_named_like_a_file_s(tiny_model_folder, capsys, monkeypatch):
    import io

    from attention_seq2seq.cli import main

    stdin = io.TextIOWrapper(io.BytesIO(b"Ein Hund.\r\nEin \xff Haus.\n"), encoding="latin-1")  # any locale
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["translate", "-m", str(tiny_model_folder), "--chunk-lines", "1", *_QUICK]) == 2
    captured = capsys.readouterr()
    assert "standard input line 2: not UTF-8 (byte 0xff at column 5)" in _one_error_of(captured.err)
    assert len(captured.out.splitlines()) == 1  # the first chunk (one line) was translated before the bad one


def test_resume_refuses_an_output_longer_than_its_input(tiny_model_folder, tmp_path, capsys):
    from attention_seq2seq.cli import main

    src, _ = _test_files(tmp_path)
    out = tmp_path / "out.txt"
    assert main(["translate", "-m", str(tiny_model_folder), "-i", str(src), "-o", str(out), *_QUICK]) == 0
    before = out.read_bytes()
    src.write_text("Ein Hund.\n", encoding="utf-8")
    assert main(["translate", "-m", str(tiny_model_folder), "-i", str(src), "-o", str(out), "--resume", *_QUICK]) == 2
    line = _one_error(capsys)
    assert "holds 2 complete source(s) but the input has only 1 line(s)" in line and "without --resume" in line
    assert out.read_bytes() == before


def test_a_device_as_output_is_written_not_replaced(tiny_model_folder, tmp_path, capsys):
    from attention_seq2seq.cli import main

    src, ref = _test_files(tmp_path)
    assert main(["translate", "-m", str(tiny_model_folder), "-i", str(src), "-o", os.devnull, *_QUICK]) == 0
    assert (
        main(
            ["evaluate", "-m", str(tiny_model_folder), "--src", str(src), "--ref", str(ref), "-o", os.devnull, *_QUICK]
        )
        == 0
    )
    assert Path(os.devnull).is_char_device()
    if Path("/dev/full").is_char_device():
        assert main(["translate", "-m", str(tiny_model_folder), "-i", str(src), "-o", "/dev/full", *_QUICK]) == 2
        assert "no space left writing the translations (/dev/full is a device" in _one_error(capsys)
        assert (
            main(
                [
                    "evaluate",
                    "-m",
                    str(tiny_model_folder),
                    "--src",
                    str(src),
                    "--ref",
                    str(ref),
                    "-o",
                    "/dev/full",
                    *_QUICK,
                ]
            )
            == 2
        )
        captured = capsys.readouterr()
        assert "BLEU" in captured.out  # the scores are printed before the write that fails
        assert "no space left writing the scores (/dev/full is a device" in captured.err
        assert Path("/dev/full").is_char_device()


def test_an_unwritable_output_folder_is_refused_before_translating(tiny_model_folder, tmp_path, capsys, monkeypatch):
    from attention_seq2seq.cli import main
    from attention_seq2seq.data import user_files

    src, ref = _test_files(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    # root passes permission bits: stand in for a read-only file system at the probe itself
    monkeypatch.setattr(
        user_files, "unwritable", lambda folder: "Read-only file system" if Path(folder) == locked else None
    )
    out = locked / "out.txt"
    assert main(["translate", "-m", str(tiny_model_folder), "-i", str(src), "-o", str(out), *_QUICK]) == 2
    assert f"--output {out}: cannot write there (Read-only file system)" in _one_error(capsys)
    argv = ["evaluate", "-m", str(tiny_model_folder), "--src", str(src), "--ref", str(ref)]
    assert main([*argv, "--hypotheses", str(locked / "h" / "hyp.txt"), *_QUICK]) == 2
    assert f"--hypotheses {locked / 'h' / 'hyp.txt'}: cannot write there (Read-only file system)" in _one_error(capsys)
    assert not (locked / "h").exists()  # checked at the nearest existing folder; nothing made


def test_a_file_the_system_refuses_late_is_one_line_after_the_scores(tiny_model_folder, tmp_path, capsys):
    """An OSError no check foresaw (here the run's metrics.json is a folder) is one line naming the
    file, not a traceback, and the scores were printed before it."""
    from attention_seq2seq.cli import main

    src, ref = _test_files(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(tiny_model_folder, run)
    (run / "metrics.json").unlink(missing_ok=True)
    (run / "metrics.json").mkdir()
    argv = ["evaluate", "-m", str(run), "--src", str(src), "--ref", str(ref), "--update-metrics", *_QUICK]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "BLEU" in captured.out and "Traceback" not in captured.err
    (line,) = [line for line in captured.err.splitlines() if "error:" in line]
    assert line.endswith(f"{run / 'metrics.json'}: Is a directory"), line
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".metrics")) == []  # no temporary file left


RECIPE_FAULTS = {
    "YAML syntax": (b"max_steps: 3\nmodel_config: {d_model: 32\n", "r.yaml line 3 column 1: not valid YAML"),
    "JSON syntax": (b'{"max_steps": 3,\n "seed": }\n', "r.json line 2 column 10: not valid JSON"),
    "binary": (b"max_steps: 3\n\x89PNG\r\n\x1a\n\x00\xff", "r.yaml line 2: not UTF-8 text"),
    "no updates": (b"max_steps: 0\n", "max_steps must be > 0 (or null: no such limit); got 0"),
    "negative updates": (b"max_steps: -3\n", "max_steps must be > 0 (or null: no such limit); got -3"),
    "no epochs": (b"max_epochs: 0\n", "max_epochs must be > 0"),
    "negative lr": (b"max_steps: 3\nlearning_rate: -1\n", "learning_rate must be > 0; got -1"),
    "beta of 1": (b"max_steps: 3\nadam_beta2: 1.0\n", "adam_beta2 must be in [0, 1); got 1.0"),
    "smoothing of 1": (b"max_steps: 3\nlabel_smoothing: 1\n", "label_smoothing must be in [0, 1)"),
}


@pytest.mark.parametrize("name", sorted(RECIPE_FAULTS))
def test_a_bad_recipe_is_one_line_before_the_run_folder_exists(tmp_path, capsys, name):
    from attention_seq2seq.cli import main

    data, message = RECIPE_FAULTS[name]
    recipe = tmp_path / ("r.json" if "JSON" in name else "r.yaml")
    recipe.write_bytes(data)
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:  # the training entry exits 2 itself (also under accelerate launch)
        main(["train", "--recipe", str(recipe), "--output_dir", str(run)])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and message in err, err
    assert not run.exists()  # nothing written: the same command runs once the recipe is fixed


def _spoil_generation_config(folder: Path) -> None:
    (folder / "generation_config.json").write_text('{"num_beams": 5,', encoding="utf-8")


def _relabel_as_the_other_family(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert config["model_type"] == "rnn_seq2seq"
    config["architectures"] = ["TransformerSeq2SeqForConditionalGeneration"]
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")


QUIET_FOLDER_FAULTS = {
    "damaged generation_config.json": (
        _spoil_generation_config,
        "its generation_config.json does not load",
    ),
    "config.json of the other family": (
        _relabel_as_the_other_family,
        "says model_type 'rnn_seq2seq' (the rnn family) but architectures 'TransformerSeq2SeqForConditionalGeneration' "
        "(the transformer family",
    ),
    "no tokenizer.json": (lambda folder: (folder / "tokenizer.json").unlink(), "its tokenizer.json is missing"),
}


@pytest.mark.parametrize("name", sorted(QUIET_FOLDER_FAULTS))
def test_a_model_folder_fault_transformers_passes_over_is_one_line(tiny_model_folder, tmp_path, capsys, name):
    """A damaged generation_config.json made transformers decode with its defaults (other
    translations, a warning at most); the other two failed with messages about something else."""
    from attention_seq2seq.cli import main

    spoil, message = QUIET_FOLDER_FAULTS[name]
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_folder / "model", folder)
    spoil(folder)
    assert main(["translate", "-m", str(folder), "Ein Hund.", *_QUICK]) == 2
    line = _one_error(capsys)
    assert f"cannot load model {folder}: " in line and message in line, line


def test_broken_model_folders_are_one_line_naming_what_is_wrong(tiny_model_folder, tmp_path, capsys):
    from transformers import BertConfig, PreTrainedTokenizerFast

    from attention_seq2seq.cli import main

    cut = tmp_path / "cut"
    shutil.copytree(tiny_model_folder / "model", cut)
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])
    other = tmp_path / "other"
    shutil.copytree(tiny_model_folder / "model", other)
    (other / "config.json").unlink()
    BertConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=16).save_pretrained(other)
    shapes = tmp_path / "shapes"
    shutil.copytree(tiny_model_folder / "model", shapes)
    config = json.loads((shapes / "config.json").read_text())
    config["vocab_size"] = 10
    (shapes / "config.json").write_text(json.dumps(config))
    foreign = tmp_path / "foreign"
    shutil.copytree(tiny_model_folder / "model", foreign)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(foreign)
    vocab_size = json.loads((foreign / "config.json").read_text())["vocab_size"]
    tokenizer.add_tokens([f"extra{i}" for i in range(vocab_size + 5 - len(tokenizer))])
    tokenizer.save_pretrained(foreign)
    expected = {
        cut: "its model.safetensors is damaged or cut short",
        other: "its config.json is a 'bert' model, not an encoder-decoder",
        shapes: "the tensors of its model.safetensors do not have the shapes its config.json describes",
        foreign: f"its tokenizer has {vocab_size + 5} tokens but the model's embeddings have {vocab_size} rows",
    }
    for folder, text in expected.items():
        assert main(["translate", "-m", str(folder), "--greedy", "Ein Hund."]) == 2, folder
        (line,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
        assert f"cannot load model {folder}: " in line and text in line, line


@pytest.mark.parametrize("kind", ["tsv", "jsonl"])
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_tsv_and_jsonl_corpora_name_the_file_and_line_of_a_hostile_line(tmp_path, kind, name):
    from attention_seq2seq.data.corpora import load_corpus
    from attention_seq2seq.data.spec import CorpusError

    bad_line = HOSTILE[name][0].split(b"\n")[1]  # b"Ein \xff Haus." or b"Ein\x00Haus."
    if kind == "tsv":
        good, bad = b"Ein Hund.\tA dog.\n", bad_line + b"\tA house.\n"
    else:
        good, bad = b'{"de": "Ein Hund.", "en": "A dog."}\n', b'{"de": "' + bad_line + b'", "en": "A house."}\n'
    path = tmp_path / f"pairs.{kind}"
    path.write_bytes(b"\xef\xbb\xbf" + good + bad + good * 30)  # a BOM too: not the fault
    column = {"tsv": 0, "jsonl": 8}[kind]  # where the bad line starts inside the row
    byte = 4 if name == "invalid UTF-8" else 3
    expected = f"{path} line 2: " + (
        f"not UTF-8 (byte 0xff at column {column + byte + 1})"
        if name == "invalid UTF-8"
        else f"a NUL byte at column {column + byte + 1}"
    )
    with pytest.raises(CorpusError, match=re.escape(expected)):
        load_corpus(f"{kind}:{path}:de-en")
