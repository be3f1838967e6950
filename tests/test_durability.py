"""common/durability.py under real faults: what a long training run or translation job meets
besides its happy path.

Each test makes one fault happen for real to a process started as a user starts it
(``python -m attention_seq2seq.training.train --recipe ...``) and checks what survives:

- kill -9 at every crash point of a tiny run (the atomic writer's,
  :func:`~attention_seq2seq.common.durability.write_atomically`: checkpoint, best-k, final model,
  metrics.json and corpus-cache writes), each followed by ``--resume``: the final weights are
  bit-identical to an uninterrupted run and no partial checkpoint is ever in place;
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

from attention_seq2seq.common.durability import (
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
        "checkpoint writes": [p for p in points if p.startswith("checkpoints/")],
        "best-k writes": [p for p in points if p.startswith("best/")],
        "final model": [p for p in points if p.startswith("run/model")],
        "metrics.json": [p for p in points if p.startswith("run/metrics.json")],
        "corpus cache": [p for p in points if "/prepared-" in p],
    }
    assert len(points) >= 16 and all(kinds.values()), kinds
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
            "import sys, time; from attention_seq2seq.common.durability import exclusive\n"
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
        env={**os.environ, STOP_AT_ENV: "cache/entry written"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_stopped(first)
        assert not final.exists() and (final.parent / ".entry.tmp").is_dir()  # caught mid-build
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
    """A tiny RNN model folder, 2000 source lines (seconds of work: a test catches the job midway)
    and their uninterrupted translation (bytes)."""
    from helpers import build_tiny_run, read_pairs

    root = tmp_path_factory.mktemp("translate-faults")
    model = build_tiny_run("rnn_seq2seq", root)
    source = root / "in.txt"
    source.write_text("".join(s + "\n" for s, _ in read_pairs(100, split="train")) * 20, encoding="utf-8")
    command = [sys.executable, "-m", "attention_seq2seq.translate", "-m", str(model), "-i", str(source)]
    command += TRANSLATE_OPTIONS
    full = root / "full.txt"
    subprocess.run([*command, "-o", str(full)], check=True, env=child_env(root / "cache"), timeout=TIMEOUT_S)
    return command, full.read_bytes(), root / "cache"


def _start(command: list[str], cache: Path, **extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        command, env=child_env(cache, **extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def stop_when_written(proc: subprocess.Popen, out: Path) -> None:
    """SIGSTOP ``proc`` once ``out`` holds a translation: caught midway, holding its lock."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if out.exists() and b"\n" in out.read_bytes():
            os.kill(proc.pid, signal.SIGSTOP)
            return
        if proc.poll() is not None:
            tail = proc.stderr.read()[-3000:]
            raise AssertionError(f"the job ended ({proc.returncode}) before it was caught: {tail}")
        time.sleep(0.005)
    proc.kill()
    raise AssertionError("the job never wrote a translation")


def test_a_second_translate_resume_on_the_same_output_is_refused_naming_the_first(translation_job, tmp_path):
    command, full, cache = translation_job
    out = tmp_path / "out.txt"
    first = _start([*command, "-o", str(out)], cache)
    try:
        stop_when_written(first, out)
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
    assert 0 < before.count(b"\n") < full.count(b"\n")  # caught midway
    done = subprocess.run([*command, "-o", str(out), "--resume"], env=child_env(cache), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == full


def test_a_full_disk_during_translate_is_one_line_and_resume_completes_the_file(translation_job, tmp_path):
    command, full, cache = translation_job
    out = tmp_path / "out.txt"
    proc = _start([*command, "-o", str(out)], cache)
    try:
        stop_when_written(proc, out)
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
    # the count is what the file holds: what was written when caught, and the lines that fit in 50 bytes
    held = kept.count(b"\n")
    assert held >= full[:written].count(b"\n") and not kept.endswith(b"\n")  # cut mid-line
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
    # Rank 1 killed -9 while the validation of update 4 saves best/step_4 (the checkpoint of update 2 is on disk).
    run = tmp_path / "killed" / "run"
    recipe = ref.recipe(tmp_path / "killed.yaml", run)
    fault = {"ATTENTION_SEQ2SEQ_FAULT_RANK": "1", KILL_AT_ENV: "best/step_4 written"}
    started = time.monotonic()
    code, stderr = _finish(_launch(recipe, tmp_path / "cache", *port, str(free_port()), extra_env=fault), timeout=120)
    assert code != 0 and time.monotonic() - started < 120
    # Rank 0 stops either way: its next collective fails (one line, exit 3), or the launcher, which
    # saw rank 1 die first, ends it with SIGTERM (a race the scheduler decides).
    lines = [line for line in stderr.splitlines() if "error: rank 0 of 2 lost contact with another rank" in line]
    terminated = re.search(r"rank\s*: 0 \(local_rank: 0\)\s+exitcode\s*: -15", stderr)
    assert len(lines) == 1 or (not lines and terminated), stderr[-4000:]
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)\s+exitcode\s*: -9", stderr), stderr[-3000:]  # the launcher names it
    assert [p.name for p in (run / "checkpoints").glob("step_*")] == ["step_2"]
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
    # Rank 1 stops itself (SIGSTOP: alive, silent, as a stuck process or a frozen machine is) while
    # the validation of update 4 saves best/step_4.
    fault = {"ATTENTION_SEQ2SEQ_FAULT_RANK": "1", STOP_AT_ENV: "best/step_4 written"}
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
    assert [p.name for p in (run / "checkpoints").glob("step_*")] == ["step_2"]


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
        "from attention_seq2seq.common.durability import DiskFullError\n"
        "if sys.argv[1] == 'limited':\n    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))\n"
        "def build(tmp):\n    (tmp / 'small.bin').write_bytes(b's' * 10)\n"
        "    (tmp / 'big.bin').write_bytes(b'b' * 500_000)\n"
        "try:\n    print(build_once(Path(sys.argv[2]), build))\n"
        "except DiskFullError as err:\n    print('error:', err)\n"
    )
    full = subprocess.run([sys.executable, "-c", script, "limited", str(final)], capture_output=True, text=True)
    (line,) = full.stdout.splitlines()
    assert line.startswith(f"error: no space left writing the corpus cache entry ({final}: "), line
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
