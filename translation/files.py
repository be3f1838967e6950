"""Translating files of any size: streaming chunks, token-budget batches, n-best lists with
scores, word alignments, resuming an interrupted run, and several processes.

The input is read ``chunk_lines`` lines at a time (default 10,000). Inside a chunk the sentences
are sorted by length in tokens and cut into batches of at most ``batch_size`` sentences and, with
``batch_tokens``, at most that many padded source tokens (sentences × longest); the chunk's output
is written in input order, flushed and fsync'd before the next chunk is read, so memory holds one
chunk whatever the file's size, and a killed run leaves whole chunks (plus at most one partly
written one) on disk. ``resume=True`` counts the complete records already in the output,
truncates a partial last line, and continues: the chunk that was being written is translated
again whole (so its batches, and the output bytes, are the same as in an uninterrupted run) and
only its missing records are written.

Output formats (docs/translate.md):

- ``text``: one translation per line (the best hypothesis).
- ``tsv`` (with ``n_best`` > 1 or ``scores``): ``n_best`` lines per source,
  ``SOURCE_INDEX<TAB>RANK<TAB>HYPOTHESIS[<TAB>LOGPROB<TAB>SCORE]`` (0-based indices; the two score
  columns with ``scores``).
- ``jsonl``: one JSON object per source: ``{"index": i, "hypotheses": [{"text": ..., "logprob": ...,
  "score": ...}, ...]}`` (scores with ``scores``).

``LOGPROB`` is the hypothesis's total log-probability (natural log) Σₜ log p(yₜ | y<ₜ, x) over the
generated tokens including ``</s>``, as the search scored them (`compute_transition_scores`);
``SCORE`` is the length-normalised score beam search ranks by, LOGPROB / length^α with α the
``length_penalty`` (transformers' ``sequences_scores``; greedy search reports the same formula).

With several processes (``accelerate launch`` / ``torchrun``), chunk c goes to rank c mod N; after
each round of N chunks rank 0 gathers the outputs and writes them in order, so the file is the one
a single process writes (the same chunks give the same batches).

With ``constraints`` (``translate --constraints FILE``) a batch in which some line has constraints
decodes with lexically constrained beam search (translation/constraints.py, Post & Vilar 2018);
a batch without any decodes with ``generate`` as before, and inside a constrained batch a line
without constraints gets what plain beam search gives it.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence, TextIO

import torch

from ..common.durability import exclusive, writing
from ..common.user_files import is_stream
from ..common.errors import UserError
from .engine import Hypothesis, RunStats, TranslationOptions, Translator, model_source_limit, token_budget_batches  # noqa: F401  (public names of this module)

FORMATS = ("text", "tsv", "jsonl")
DEFAULT_CHUNK_LINES = 10_000


@dataclass
class FileTranslationOptions(TranslationOptions):
    """What `translate_stream` does besides decoding: the engine's options (batching, truncation,
    n-best, scores, alignments, constraints) and the file's (chunks, output format)."""

    chunk_lines: int = DEFAULT_CHUNK_LINES
    format: str = "text"

    @property
    def lines_per_source(self) -> int:
        return self.n_best if self.format == "tsv" else 1


def resolve_format(n_best: int, scores: bool, fmt: str | None) -> str:
    """The output format: ``fmt`` when given, else ``tsv`` for n-best lists or scores, else ``text``."""
    if fmt is None:
        return "tsv" if (n_best > 1 or scores) else "text"
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    if fmt == "text" and (n_best > 1 or scores):
        raise UserError(
            "--format text holds one translation per line; --n-best > 1 and --scores need --format tsv or jsonl"
        )
    return fmt


# ---------------------------------------------------------------------------------------------
# Resuming


def complete_records(path: Path, lines_per_source: int) -> tuple[int, int]:
    """(complete sources, byte offset where they end) of an output file.

    A line is complete when it ends with ``\\n``; a source is complete when all its
    ``lines_per_source`` lines are. Everything after the returned offset (a partial line, or a
    source's first lines without its last) is to be truncated.
    """
    if not path.exists():
        return 0, 0
    lines = 0
    offset = 0  # end of the last complete source
    position = 0
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            start = 0
            while (newline := block.find(b"\n", start)) != -1:
                lines += 1
                if lines % lines_per_source == 0:
                    offset = position + newline + 1
                start = newline + 1
            position += len(block)
    return lines // lines_per_source, offset


def count_lines(path: Path) -> int:
    """Lines of a text file (a last line without ``\\n`` counts)."""
    count, last = 0, b"\n"
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


# ---------------------------------------------------------------------------------------------
# Writing


def format_records(
    start_index: int, hypotheses: Sequence[list[Hypothesis]], options: FileTranslationOptions
) -> tuple[str, str | None]:
    """(output text, alignment text or None) of consecutive sources from ``start_index``."""
    out: list[str] = []
    align: list[str] = []
    for offset, hyps in enumerate(hypotheses):
        index = start_index + offset
        if options.format == "text":
            out.append(hyps[0].text.replace("\n", " ") + "\n")
        elif options.format == "tsv":
            for rank, h in enumerate(hyps):
                fields = [str(index), str(rank), h.text.replace("\t", " ").replace("\n", " ")]
                if options.scores:
                    fields += [f"{h.logprob:.6f}", f"{h.score:.6f}"]
                out.append("\t".join(fields) + "\n")
        else:
            items = []
            for h in hyps:
                item: dict = {"text": h.text}
                if options.scores:
                    item.update(logprob=round(h.logprob, 6), score=round(h.score, 6))
                if options.align:
                    item["alignment"] = h.alignment
                items.append(item)
            out.append(json.dumps({"index": index, "hypotheses": items}, ensure_ascii=False) + "\n")
        if options.align:
            lines = hyps if options.format == "tsv" else hyps[:1]
            align.extend((h.alignment or "") + "\n" for h in lines)
    return "".join(out), ("".join(align) if options.align else None)


class _Sink:
    """An output file appended to in whole chunks (unbuffered, fsync'd), or a text stream.

    ``fresh``: the file's old content is dropped only at the first write (or at :meth:`finish`),
    so a run that fails before it has a translation to write (a model that cannot decode, a
    bad line) leaves the old file as it was. A stream (:func:`~attention_seq2seq.common.user_files.is_stream`:
    ``/dev/null``, a terminal, a pipe) is only ever appended to and never fsync'd.
    """

    def __init__(self, path: Path | None, stream: TextIO | None = None, *, fresh: bool = False):
        self.path = path
        self.stream = stream
        self.handle = None
        self.sync = False
        self.fresh = fresh and path is not None and not is_stream(path)
        if path is not None and not self.fresh:
            self._open("ab")

    def _open(self, mode: str) -> None:
        # Unbuffered: a failed write (a full disk) leaves nothing in a buffer for close() to retry.
        self.handle = open(self.path, mode, buffering=0)
        self.sync = stat.S_ISREG(os.fstat(self.handle.fileno()).st_mode)  # a device refuses fsync

    def write(self, text: str) -> None:
        if self.path is not None:
            if self.handle is None:
                self._open("wb")  # the old content goes now, with the first translations at hand
            data = memoryview(text.encode("utf-8"))
            while data:
                data = data[self.handle.write(data) :]
            if self.sync:
                os.fsync(self.handle.fileno())
        elif self.stream is not None:
            self.stream.write(text)
            self.stream.flush()

    def finish(self) -> None:
        """The run succeeded: a fresh file nothing was written to (an empty input) is emptied."""
        if self.path is not None and self.handle is None:
            self._open("wb")

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


def _format_of(path: Path) -> str | None:
    """The format (``text``, ``tsv``, ``jsonl``) of an output file's first line; None when empty."""
    with open(path, "rb") as handle:
        first = handle.readline(1 << 20).decode("utf-8", "replace").rstrip("\r\n")
    if not first:
        return None
    if first.startswith("{"):
        try:
            record = json.loads(first)
        except ValueError:
            record = None
        if isinstance(record, dict) and "index" in record and "hypotheses" in record:
            return "jsonl"
    fields = first.split("\t")
    if len(fields) >= 3 and fields[0].isdigit() and fields[1].isdigit():
        return "tsv"
    return "text"


# ---------------------------------------------------------------------------------------------
# The loop


def _chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for line in lines:
        chunk.append(line.rstrip("\r\n"))
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def process_group():
    """(rank, world size, state) under ``accelerate launch`` / ``torchrun``; (0, 1, None) otherwise."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1, None
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())
    return state.process_index, state.num_processes, state


def translate_stream(
    loaded,
    lines: Iterable[str],
    *,
    options: FileTranslationOptions,
    generate_kwargs: dict,
    output: Path | None = None,
    stream: TextIO | None = None,
    alignments: Path | None = None,
    resume: bool = False,
    total: int | None = None,
    progress: bool = False,
) -> RunStats:
    """Translate ``lines`` (one sentence each) chunk by chunk into ``output`` (a file, appended to
    with fsync after each chunk) or ``stream``; see the module docstring for formats and resuming.

    ``alignments``: a file for the Pharaoh alignments, one line per output line (``options.align``).
    ``total``: the number of input lines, for the progress bar's ETA.

    Raises :class:`UserError` for an over-long line without truncation, a bad ``--align-layer``
    or ``--align-heads``, or ``resume`` without an output file;
    :class:`~attention_seq2seq.common.durability.LockedError` when another live process writes the
    same ``output`` file (under this name or through a symbolic link; the message names the process);
    :class:`~attention_seq2seq.common.durability.DiskFullError` when the disk fills (one line: the
    file, the space free, how many complete records it keeps; ``--resume`` continues).
    """
    rank, _, _ = process_group()
    if resume and output is not None and is_stream(output):
        raise UserError(
            f"--resume: --output {output} is a stream (not a regular file: a device or a pipe), which holds "
            "nothing to continue; give the output file"
        )
    if output is None or rank != 0 or is_stream(output):  # nothing to lock on /dev/null or a pipe
        return _translate_stream(
            loaded, lines, options, generate_kwargs, output, stream, alignments, resume, total, progress
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    # The lock file sits beside the file a link leads to: a link to an output being written is refused too.
    real = Path(os.path.realpath(output))
    with exclusive(real.with_name(f".{real.name}.lock"), f"the output file {output}"):
        return _translate_stream(
            loaded, lines, options, generate_kwargs, output, stream, alignments, resume, total, progress
        )


def _translate_stream(loaded, lines, options, generate_kwargs, output, stream, alignments, resume, total, progress):
    from tqdm.auto import tqdm

    rank, world, state = process_group()
    stats = RunStats()
    done = 0
    if resume:
        if output is None:
            raise UserError("--resume needs --output FILE (the file to continue)")
        found = _format_of(output) if output.is_file() else None
        if found is not None and found != options.format:
            raise UserError(
                f"--resume: {output} holds {found} output, not {options.format} (--format, --n-best, --scores); "
                f"resume with the options of the interrupted run, or translate without --resume to start again"
            )
        done, _ = complete_records(output, options.lines_per_source)
        if alignments is not None:
            align_done, _ = complete_records(alignments, options.lines_per_source)
            done = min(done, align_done)
        if total is not None and done > total:
            raise UserError(
                f"--resume: {output} holds {done} complete source(s) but the input has only {total} line(s), "
                "so it is not this input's output; translate without --resume to start it again"
            )
        if rank == 0:
            # Cut back to `done` complete sources in both files (a partial line, a source's first lines).
            _truncate_to(output, done, options.lines_per_source)
            if alignments is not None:
                _truncate_to(alignments, done, options.lines_per_source)
    if state is not None:
        state.wait_for_everyone()
    stats.skipped = done
    first_chunk = done // options.chunk_lines  # the chunk being written when the run stopped
    if rank == 0 and not resume and alignments is not None:
        alignments.parent.mkdir(parents=True, exist_ok=True)
    # A fresh run's files are emptied at their first write, not here (see _Sink).
    sink = _Sink(output, stream, fresh=not resume) if rank == 0 else None
    align_sink = _Sink(alignments, fresh=not resume) if (rank == 0 and alignments is not None) else None

    def kept() -> str:  # counted when the disk fills: what the files hold, partly written chunk aside
        # A stream (/dev/full, a pipe) cannot be read back (/dev/full reads zeros forever): what was
        # written before the chunk at hand is what it got.
        on_disk = output is not None and not is_stream(output)
        held = complete_records(output, options.lines_per_source)[0] if on_disk else first
        if alignments is not None:
            held = min(held, complete_records(alignments, options.lines_per_source)[0])
        return f"it holds {held} complete source(s); rerun with --resume once there is space"

    translator = Translator(loaded, options, generate_kwargs)
    bar = tqdm(
        total=total,
        initial=min(done, total or done),
        unit="sent",
        disable=not progress or rank != 0,
        dynamic_ncols=True,
        smoothing=0.1,
    )
    chunk_iter = _chunks(lines, options.chunk_lines)
    written = 0
    try:
        index = 0  # chunk index in the whole input
        while True:
            # One round: the next `world` chunks from first_chunk on, chunk c to rank c mod world.
            mine = None
            round_chunks = 0
            for chunk in chunk_iter:
                if index < first_chunk:
                    index += 1
                    continue
                if index % world == rank:
                    mine = (index, chunk)
                index += 1
                round_chunks += 1
                if round_chunks == world:
                    break
            if round_chunks == 0:
                break
            produced = []
            if mine is not None:
                c, chunk = mine
                start = c * options.chunk_lines
                hyps = translator.translate(chunk, start + 1, stats)
                skip = max(0, done - start)  # records of a partly written chunk already on disk
                produced.append((c, start + skip, hyps[skip:]))
            if state is not None:
                from accelerate.utils import gather_object

                produced = gather_object(produced)
            if rank == 0:
                for c, first, hyps in sorted(produced, key=lambda item: item[0]):
                    text, align_text = format_records(first, hyps, options)
                    with writing(output or "the output", "the translations", kept=kept):
                        sink.write(text)
                        if align_sink is not None:
                            align_sink.write(align_text)
                    bar.update(len(hyps))
                    written += len(hyps)
            if round_chunks < world:
                break
        for done_sink in (sink, align_sink):
            if done_sink is not None:
                done_sink.finish()
    finally:
        bar.close()
        if sink is not None:
            sink.close()
        if align_sink is not None:
            align_sink.close()
    if state is not None:
        # Each rank counted its own chunks' truncations; sum them for the one warning.
        from accelerate.utils import gather_object

        counts = gather_object([(stats.truncated, stats.first_truncated, stats.empty)])
        stats.truncated = sum(c[0] for c in counts)
        firsts = [c[1] for c in counts if c[1] is not None]
        stats.first_truncated = min(firsts) if firsts else None
        stats.empty = sum(c[2] for c in counts)
    stats.sources = done + written
    return stats


def _truncate_to(path: Path, sources: int, lines_per_source: int) -> None:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        return
    lines = 0
    offset = 0
    with open(path, "rb") as handle:
        position = 0
        target = sources * lines_per_source
        while lines < target and (block := handle.read(1 << 20)):
            start = 0
            while lines < target and (newline := block.find(b"\n", start)) != -1:
                lines += 1
                offset = position + newline + 1
                start = newline + 1
            position += len(block)
    if target == 0:
        offset = 0
    with open(path, "r+b") as handle:
        handle.truncate(offset)
        handle.flush()
        os.fsync(handle.fileno())


def process_device(device: str | None) -> str | None:
    """This process's device: ``device`` when given; with several processes (``accelerate launch``
    / ``torchrun``) the GPU of its local rank, or the CPU without one; else None (the loader's
    choice: the first accelerator)."""
    rank, world, _ = process_group()
    if device is not None or world == 1:
        return device
    return f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}" if torch.cuda.is_available() else "cpu"


def read_constraints_file(path, tokenizer, n_lines: int) -> list[list[list[int]]]:
    """Read the constraints of ``translate --constraints FILE``: one line per source line, the
    target phrases of that line separated by tabs; an empty line: no constraints.

    Each phrase (stripped of surrounding spaces) becomes
    ``tokenizer(text_target=phrase, add_special_tokens=False)["input_ids"]``.

    Args:
        path: the file (UTF-8).
        tokenizer: the model's tokenizer (its target side).
        n_lines: the number of source lines.

    Returns:
        ``n_lines`` lists of phrases (lists of token ids).

    Raises:
        UserError: the file is missing or unreadable, has another number of lines than
            ``n_lines`` (naming the file and both counts), or a line has an empty phrase (two tabs
            in a row, a tab at an end) or a phrase the tokenizer turns into no tokens (naming the
            file and the line).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read the constraints file {path}: {error}") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    if len(lines) != n_lines:
        raise UserError(
            f"the constraints file {path} has {len(lines)} line(s) but the source has {n_lines}; "
            "give one line per source line (an empty line for no constraints)"
        )
    constraints = []
    for number, line in enumerate(lines, start=1):
        line = line.rstrip("\r")
        if not line.strip():
            constraints.append([])
            continue
        phrases = []
        for phrase in line.split("\t"):
            phrase = phrase.strip()
            if not phrase:
                raise UserError(f"{path}:{number}: an empty constraint (two tabs in a row, or a tab at an end)")
            ids = list(tokenizer(text_target=phrase, add_special_tokens=False)["input_ids"])
            if not ids:
                raise UserError(f"{path}:{number}: the constraint {phrase!r} has no tokens")
            phrases.append(ids)
        constraints.append(phrases)
    return constraints
