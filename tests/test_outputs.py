"""The files translate and evaluate write (common/user_files.py, common/durability.py).

An output is one of two kinds (``is_stream``): a regular *file*, emptied only when the first
translations are ready (a run that fails before keeps the old file), locked (a lock file beside
the file a symbolic link leads to: a link to an output being written is refused), and written
whole through a temporary file by evaluate (a full disk keeps the old one); or anything else that
exists (a device, a pipe), simply written to: never emptied, replaced, locked or resumed. A name
the system refuses (empty, a link loop, too long) and a generation_config.json value generate
would fail on are one line each before anything is written.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import one_line_error

QUICK = ["--greedy", "--max-new-tokens", "4", "--no-progress"]
OLD = "yesterday's translations\n"


@pytest.fixture(scope="module")
def model_run(tmp_path_factory):
    from helpers import build_tiny_run

    return build_tiny_run("rnn_seq2seq", tmp_path_factory.mktemp("outputs"))


def _main():
    from attention_seq2seq.cli import main

    return main


def _sources(tmp_path: Path, lines: int = 2) -> tuple[Path, Path]:
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("".join(f"Ein Hund {i}.\n" for i in range(lines)), encoding="utf-8")
    ref.write_text("".join(f"A dog {i}.\n" for i in range(lines)), encoding="utf-8")
    return src, ref


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "attention_seq2seq.cli", *args]


# --- streams -------------------------------------------------------------------------------


def test_dev_stdout_into_a_pipe_is_written_and_nothing_is_locked_beside_it(model_run, tmp_path):
    src, _ = _sources(tmp_path)
    argv = _cli("translate", "-m", str(model_run), "-i", str(src), "-o", "/dev/stdout", *QUICK)
    before = sorted(os.listdir("/dev"))
    piped = subprocess.run(argv, capture_output=True, text=True)  # stdout a pipe
    assert piped.returncode == 0, piped.stderr
    assert len(piped.stdout.splitlines()) == 2
    assert sorted(os.listdir("/dev")) == before  # no lock file beside a stream


def test_a_stream_is_no_file_so_two_outputs_may_both_be_dev_null_and_it_cannot_be_resumed(model_run, tmp_path, capsys):
    main = _main()
    src, ref = _sources(tmp_path)
    argv = ["evaluate", "-m", str(model_run), "--src", str(src), "--ref", str(ref), *QUICK]
    assert main([*argv, "-o", os.devnull, "--hypotheses", os.devnull, "--per-sentence", os.devnull]) == 0
    capsys.readouterr()
    line = one_line_error(
        capsys, main, ["translate", "-m", str(model_run), "-i", str(src), "-o", os.devnull, "--resume", *QUICK]
    )
    assert f"--resume: --output {os.devnull} is a stream" in line and "give the output file" in line


# --- names that cannot be a file -----------------------------------------------------------


def _loop(tmp_path: Path) -> Path:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    return loop


BAD_NAMES = {
    "empty": (lambda tmp_path: "", "'': give a file name"),
    "link loop": (lambda tmp_path: str(_loop(tmp_path)), "cannot write there (Too many levels of symbolic links)"),
    "too long": (lambda tmp_path: str(tmp_path / ("x" * 300)), "cannot write there (File name too long)"),
}


@pytest.mark.parametrize("option", ["--output", "--alignments", "--hypotheses"])
@pytest.mark.parametrize("name", sorted(BAD_NAMES))
def test_a_name_that_cannot_be_a_file_is_one_line_naming_the_option(model_run, tmp_path, capsys, name, option):
    main = _main()
    src, ref = _sources(tmp_path)
    make, message = BAD_NAMES[name]
    target = make(tmp_path)
    if option == "--hypotheses":
        argv = ["evaluate", "-m", str(model_run), "--src", str(src), "--ref", str(ref), option, target]
    else:
        out = [] if option == "--output" else ["-o", str(tmp_path / "out.txt")]
        argv = ["translate", "-m", str(model_run), "-i", str(src), *out, option, target]
    line = one_line_error(capsys, main, [*argv, *QUICK])
    assert f"{option}" in line and message in line, line
    assert not (tmp_path / "out.txt").exists()


def test_an_empty_input_name_is_refused_not_read_from_standard_input(model_run, tmp_path, capsys):
    line = one_line_error(capsys, _main(), ["translate", "-m", str(model_run), "-i", "", *QUICK])
    assert "--input '': give a file name" in line


def test_a_link_to_a_file_not_there_yet_is_written_through_and_stays_a_link(model_run, tmp_path):
    main = _main()
    src, ref = _sources(tmp_path)
    (tmp_path / "real").mkdir()
    for option in ("-o", "--hypotheses"):
        link = tmp_path / f"link{option}"
        link.symlink_to(tmp_path / "real" / f"out{option}.txt")
        evaluate = ["evaluate", "--src", str(src), "--ref", str(ref), "-o", os.devnull]
        argv = evaluate if option != "-o" else ["translate", "-i", str(src)]
        assert main([*argv, "-m", str(model_run), option, str(link), *QUICK]) == 0
        assert link.is_symlink() and len(link.read_text(encoding="utf-8").splitlines()) == 2


# --- one writer per file -------------------------------------------------------------------


def test_a_symbolic_link_to_an_output_being_written_is_refused_naming_the_writer(model_run, tmp_path, capsys):
    main = _main()
    src, _ = _sources(tmp_path)
    out = tmp_path / "out.txt"
    out.write_text(OLD, encoding="utf-8")
    (tmp_path / "symbolic.txt").symlink_to(out)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nfrom attention_seq2seq.common.durability import exclusive\n"
            f"with exclusive({str(tmp_path / '.out.txt.lock')!r}, 'x'):\n"
            "    print('held', flush=True)\n    time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        for name in ("out.txt", "symbolic.txt"):
            argv = ["translate", "-m", str(model_run), "-i", str(src), "-o", str(tmp_path / name), *QUICK]
            line = one_line_error(capsys, main, argv)
            assert f"the output file {tmp_path / name} is in use by process {holder.pid} on " in line, line
        assert out.read_text(encoding="utf-8") == OLD
    finally:
        holder.kill()
        holder.wait()
    # once the writer is gone the same command runs
    assert main(["translate", "-m", str(model_run), "-i", str(src), "-o", str(tmp_path / "symbolic.txt"), *QUICK]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2
    names = [".out.txt.lock", "out.txt", "ref.txt", "src.txt", "symbolic.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == names


# --- the old output is kept until there is something to write --------------------------------


def test_a_run_that_fails_before_its_first_translations_keeps_the_old_output(model_run, tmp_path, monkeypatch):
    from attention_seq2seq.translation import files

    src, _ = _sources(tmp_path)
    out, fresh = tmp_path / "out.txt", tmp_path / "new" / "fresh.txt"
    out.write_text(OLD, encoding="utf-8")

    def fails(self, *args, **kwargs):
        raise RuntimeError("the decoder failed")

    monkeypatch.setattr(files.Translator, "translate", fails)
    for target in (out, fresh):
        with pytest.raises(RuntimeError, match="the decoder failed"):
            _main()(["translate", "-m", str(model_run), "-i", str(src), "-o", str(target), *QUICK])
    assert out.read_text(encoding="utf-8") == OLD
    assert not fresh.exists()  # nothing was written to it


def test_an_empty_input_still_empties_the_output(model_run, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    out = tmp_path / "out.txt"
    out.write_text(OLD, encoding="utf-8")
    assert _main()(["translate", "-m", str(model_run), "-i", str(empty), "-o", str(out), *QUICK]) == 0
    assert out.read_bytes() == b""


GENERATION_FAULTS = {
    "num_beams -3": ({"num_beams": -3}, "field num_beams is -3; valid: a whole number >= 1"),
    "num_beams 0": ({"num_beams": 0}, "field num_beams is 0"),
    "num_beams 2.5": ({"num_beams": 2.5}, "field num_beams is 2.5"),
    "num_beams text": ({"num_beams": "4"}, 'field num_beams is "4"'),
    "length_penalty text": ({"length_penalty": "x"}, 'field length_penalty is "x"; valid: a finite number'),
    "length_penalty NaN": ({"length_penalty": float("nan")}, "field length_penalty is NaN"),
    "decoder_start_token_id -5": ({"decoder_start_token_id": -5}, "field decoder_start_token_id is -5"),
    "eos_token_id past the vocabulary": (
        {"eos_token_id": [2, 10**6]},
        "field eos_token_id is [2, 1000000]; valid: a token id in [0, ",
    ),
}


@pytest.mark.parametrize("name", sorted(GENERATION_FAULTS))
def test_a_generation_config_value_generate_would_fail_on_is_one_line_and_keeps_the_output(
    model_run, tmp_path, capsys, name
):
    values, message = GENERATION_FAULTS[name]
    folder = tmp_path / "model"
    shutil.copytree(model_run / "model", folder)
    config_file = folder / "generation_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config_file.write_text(json.dumps({**config, **values}), encoding="utf-8")
    src, _ = _sources(tmp_path)
    out = tmp_path / "out.txt"
    out.write_text(OLD, encoding="utf-8")
    line = one_line_error(capsys, _main(), ["translate", "-m", str(folder), "-i", str(src), "-o", str(out), *QUICK])
    assert f"cannot load model {folder}: its generation_config.json {message}" in line, line
    assert out.read_text(encoding="utf-8") == OLD


def test_the_model_s_own_generation_config_passes_the_check(model_run):
    from attention_seq2seq.translation.loading import generation_config_fault

    values = json.loads((model_run / "model" / "generation_config.json").read_text(encoding="utf-8"))
    vocab_size = json.loads((model_run / "model" / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    assert generation_config_fault(values, vocab_size) is None
    assert generation_config_fault({**values, "num_beams": None, "top_p": 1.0}, vocab_size) is None
    assert "top_p" in generation_config_fault({"top_p": 1.5}, vocab_size)
    assert "bool" not in (generation_config_fault({"num_beams": True}, vocab_size) or "bool")


# --- resume ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "then"), [([], ["--format", "jsonl"]), (["--format", "jsonl"], []), (["--scores"], [])]
)
def test_resume_refuses_an_output_of_another_format(model_run, tmp_path, capsys, first, then):
    main = _main()
    src, _ = _sources(tmp_path)
    out = tmp_path / "out.txt"
    argv = ["translate", "-m", str(model_run), "-i", str(src), "-o", str(out), *QUICK]
    assert main([*argv, *first]) == 0
    before = out.read_bytes()
    capsys.readouterr()
    line = one_line_error(capsys, main, [*argv, "--resume", *then])
    assert f"--resume: {out} holds " in line and "resume with the options of the interrupted run" in line, line
    assert out.read_bytes() == before


# --- full disk ---------------------------------------------------------------------------------


def _disk_fills_on_call(monkeypatch, module, call: int, keep_bytes: int):
    """Make ``module.open``'d files fail with ENOSPC on the ``call``-th write, after writing
    ``keep_bytes`` of it (a disk that fills partway through a write)."""
    real_open = open
    writes = {"n": 0}

    class Filling:
        def __init__(self, handle):
            self.handle = handle

        def write(self, data):
            writes["n"] += 1
            if writes["n"] == call:
                self.handle.write(data[:keep_bytes])
                self.handle.flush()
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.handle.write(data)

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    def filling_open(path, *args, **kwargs):
        return Filling(real_open(path, *args, **kwargs))

    monkeypatch.setattr(module, "open", filling_open, raising=False)


def test_a_full_disk_partway_through_a_chunk_names_the_sources_the_file_really_holds(
    model_run, tmp_path, capsys, monkeypatch
):
    from attention_seq2seq.translation import files

    src, _ = _sources(tmp_path, lines=10)
    out = tmp_path / "out.txt"
    main = _main()
    assert main(["translate", "-m", str(model_run), "-i", str(src), "-o", str(tmp_path / "whole.txt"), *QUICK]) == 0
    whole = (tmp_path / "whole.txt").read_bytes()
    second_chunk = whole.split(b"\n", 5)[5]
    keep = len(b"\n".join(second_chunk.split(b"\n")[:3])) + 2  # three lines and two bytes of the fourth
    _disk_fills_on_call(monkeypatch, files, call=2, keep_bytes=keep)
    argv = ["translate", "-m", str(model_run), "-i", str(src), "-o", str(out), "--chunk-lines", "5", *QUICK]
    line = one_line_error(capsys, main, argv)
    assert "no space left writing the translations" in line and "it holds 8 complete source(s)" in line, line
    monkeypatch.undo()
    assert main([*argv, "--resume"]) == 0
    assert out.read_bytes() == whole


def test_a_full_disk_while_evaluate_writes_keeps_the_old_files_whole(model_run, tmp_path, capsys, monkeypatch):
    from attention_seq2seq.common import user_files

    src, ref = _sources(tmp_path)
    hypotheses = tmp_path / "hyp.txt"
    hypotheses.write_text(OLD, encoding="utf-8")
    _disk_fills_on_call(monkeypatch, user_files, call=2, keep_bytes=3)  # the scores, then the translations
    argv = ["evaluate", "-m", str(model_run), "--src", str(src), "--ref", str(ref), "--hypotheses", str(hypotheses)]
    argv += ["-o", str(tmp_path / "scores.json")]
    assert _main()([*argv, *QUICK]) == 2
    captured = capsys.readouterr()
    (line,) = [entry for entry in captured.err.splitlines() if "error:" in entry]
    assert "BLEU" in captured.out and "no space left writing the translations" in line, line
    assert "the file is as it was before this run" in line
    assert hypotheses.read_text(encoding="utf-8") == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "hyp.txt",
        "ref.txt",
        "scores.json",
        "src.txt",
    ]  # no temporary


def test_write_whole_keeps_the_permissions_and_the_link(tmp_path):
    from attention_seq2seq.common.user_files import write_whole

    target = tmp_path / "scores.json"
    target.write_text("old\n", encoding="utf-8")
    target.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_whole(link, "new\n")
    assert link.is_symlink() and target.read_text(encoding="utf-8") == "new\n"
    assert target.stat().st_mode & 0o777 == 0o640


def test_a_constraints_file_that_is_not_utf8_names_its_line_and_column(model_run, tmp_path, capsys):
    src, _ = _sources(tmp_path)
    constraints = tmp_path / "constraints.txt"
    constraints.write_bytes(b"Hund\n\xffHaus\n")
    argv = ["translate", "-m", str(model_run), "-i", str(src), "--constraints", str(constraints), "--num-beams", "2"]
    line = one_line_error(capsys, _main(), [*argv, "--max-new-tokens", "4", "--no-progress"])
    assert f"{constraints} line 2: not UTF-8 (byte 0xff at column 1)" in line, line
