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
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence, TextIO

import torch

from ..errors import UserError
from .loading import token_budget_batches

FORMATS = ("text", "tsv", "jsonl")
DEFAULT_CHUNK_LINES = 10_000


@dataclass
class FileTranslationOptions:
    """What `translate_stream` does besides decoding (the ``generate`` kwargs go separately)."""

    batch_size: int = 32
    batch_tokens: int | None = None  # padded source tokens per batch
    chunk_lines: int = DEFAULT_CHUNK_LINES
    max_source_length: int | None = None  # None: the model's limit
    truncate: bool = True  # False: an over-long line is an error
    n_best: int = 1
    scores: bool = False
    format: str = "text"
    align: bool = False
    align_layer: int = -1
    align_heads: Sequence[int] | None = None
    # Terminology constraints: per input line (0-based, the whole input, not one chunk), a list of
    # target phrases as token ids that its translation must contain (translation/constraints.py);
    # None: no constraints at all.
    constraints: Sequence[Sequence[Sequence[int]]] | None = None

    @property
    def lines_per_source(self) -> int:
        return self.n_best if self.format == "tsv" else 1


@dataclass
class Hypothesis:
    text: str
    logprob: float | None = None
    score: float | None = None
    alignment: str | None = None  # Pharaoh line


@dataclass
class RunStats:
    sources: int = 0  # sources handled in this run (written or already there)
    skipped: int = 0  # sources found complete in the output by --resume
    truncated: int = 0
    first_truncated: int | None = None  # 1-based input line
    empty: int = 0
    extra: dict = field(default_factory=dict)


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
# Batching


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
# Translating one chunk


def model_source_limit(model, tokenizer) -> int | None:
    """The longest source the model takes: ``max_position_embeddings`` (Transformer) or the
    tokenizer's ``model_max_length`` when that is a real limit; None when there is none."""
    limit = getattr(model.config, "max_position_embeddings", None)
    tok_limit = getattr(tokenizer, "model_max_length", None)
    if tok_limit is not None and tok_limit < 1_000_000:
        limit = min(limit, tok_limit) if limit else tok_limit
    return limit


def _generated_mask(generated: torch.Tensor, eos_ids: set[int], pad_id: int | None) -> torch.Tensor:
    """(rows, new_tokens) bool: the generated tokens up to and including the first ``</s>``."""
    is_eos = torch.zeros_like(generated, dtype=torch.bool)
    for eos in eos_ids:
        is_eos |= generated == eos
    before = torch.cumsum(is_eos.int(), dim=1) - is_eos.int()  # </s> seen before this position
    return before == 0


class ChunkTranslator:
    """Translates lists of sentences into `Hypothesis` lists (``n_best`` per sentence)."""

    def __init__(self, loaded, options: FileTranslationOptions, generate_kwargs: dict):
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.options = options
        # A CTranslate2 folder (export --format ct2) translates through CTranslate2's own batching.
        self.ct2 = getattr(self.model.config, "model_type", None) == "ctranslate2"
        if self.ct2 and options.align:
            raise UserError(
                "--alignments reads the model's attention weights, which a CTranslate2 folder does not "
                "return; use the PyTorch model (the training run or a --format remote/native export)"
            )
        is_ensemble = getattr(self.model.config, "model_type", None) == "attention_seq2seq_ensemble"
        if is_ensemble and options.align:
            raise UserError(
                "--alignments reads one model's attention weights; an ensemble (-m given several times) "
                "has several: align with one of its models"
            )
        if options.constraints is not None:
            if self.ct2:
                raise UserError(
                    "--constraints needs the PyTorch model (constrained beam search runs in this package); "
                    "a CTranslate2 folder cannot take it: use the training run or a --format remote/native export"
                )
            if generate_kwargs.get("do_sample"):
                raise UserError("--constraints runs a beam search; it does not combine with --do-sample")
        self.device = None if self.ct2 else next(self.model.parameters()).device
        self.limit = options.max_source_length or model_source_limit(self.model, self.tokenizer)
        kwargs = dict(generate_kwargs)
        config = self.model.generation_config
        if options.n_best > 1:
            beams = kwargs.get("num_beams") or config.num_beams or 1
            if kwargs.get("do_sample"):
                kwargs["num_return_sequences"] = options.n_best  # K samples (not necessarily distinct)
            else:
                if beams < options.n_best:
                    if "num_beams" in generate_kwargs:
                        raise UserError(
                            f"--n-best {options.n_best} needs --num-beams >= {options.n_best}; got --num-beams {beams}"
                        )
                    kwargs["num_beams"] = options.n_best
                kwargs["num_return_sequences"] = options.n_best
        if options.scores:
            kwargs.update(output_scores=True, return_dict_in_generate=True)
        self.kwargs = kwargs
        eos = config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else ([eos] if eos is not None else []))
        self.pad_id = config.pad_token_id
        alpha = kwargs.get("length_penalty", config.length_penalty)
        self.length_penalty = 1.0 if alpha is None else float(alpha)

    def encode(self, sentences: Sequence[str], first_line: int, stats: RunStats) -> list[list[int]]:
        """Token ids of each sentence ([] for an empty one), truncated to the model's limit."""
        ids: list[list[int]] = [[] for _ in sentences]
        texts = [(k, s) for k, s in enumerate(sentences) if s.strip()]
        if texts:
            encoded = self.tokenizer([s for _, s in texts], add_special_tokens=True)["input_ids"]
            for (k, _), row in zip(texts, encoded):
                ids[k] = row
        for k, row in enumerate(ids):
            if not row:
                stats.empty += 1
            elif self.limit is not None and len(row) > self.limit:
                line = first_line + k
                if not self.options.truncate:
                    raise UserError(
                        f"line {line}: {len(row)} tokens, more than the limit of {self.limit} "
                        "(--max-source-length or the model's); drop --no-truncate to truncate such lines"
                    )
                stats.truncated += 1
                if stats.first_truncated is None:
                    stats.first_truncated = line
                # Keep the sentence end: the last piece of a tokenized sentence is </s>.
                keeps_eos = self.eos_ids and row[-1] in self.eos_ids
                ids[k] = row[: self.limit - 1] + row[-1:] if keeps_eos else row[: self.limit]
        return ids

    @torch.inference_mode()
    def translate(self, sentences: Sequence[str], first_line: int, stats: RunStats) -> list[list[Hypothesis]]:
        """``n_best`` hypotheses for each sentence (empty sentences get empty hypotheses);
        ``first_line`` is the 1-based input line of ``sentences[0]``, for messages."""
        options = self.options
        ids = self.encode(sentences, first_line, stats)
        result: list[list[Hypothesis]] = [
            [
                Hypothesis(
                    "", 0.0 if options.scores else None, 0.0 if options.scores else None, "" if options.align else None
                )
            ]
            * options.n_best
            for _ in sentences
        ]
        if self.ct2:
            return self._translate_ct2(sentences, ids, result)
        for batch in token_budget_batches([len(row) for row in ids], options.batch_size, options.batch_tokens):
            padded = self.tokenizer.pad({"input_ids": [ids[k] for k in batch]}, return_tensors="pt")
            input_ids = padded["input_ids"].to(self.device)
            attention_mask = padded["attention_mask"].to(self.device)
            constraints = None
            if options.constraints is not None:
                constraints = [list(options.constraints[first_line - 1 + k]) for k in batch]
                if not any(constraints):
                    constraints = None  # no line of this batch has any: plain generate
            if constraints is None:
                out = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **self.kwargs)
            else:
                from .constraints import constrained_decoding

                try:
                    out = self.model.generate(
                        input_ids=input_ids,
                        attention_mask=attention_mask,
                        custom_generate=constrained_decoding,
                        constraints=constraints,
                        **self.kwargs,
                    )
                except ValueError as error:  # a phrase longer than the output may be, say
                    lines = ", ".join(str(first_line + k) for k in batch)
                    raise UserError(f"--constraints (lines {lines}): {error}") from None
            sequences = out.sequences if options.scores else out  # (batch * n_best, 1 + new_tokens)
            texts = [t.strip() for t in self.tokenizer.batch_decode(sequences, skip_special_tokens=True)]
            logprobs = normalised = None
            if options.scores:
                logprobs, normalised = self.sequence_scores(out)
            alignments = None
            if options.align:
                sources = [sentences[k] for k in batch for _ in range(options.n_best)]
                links = self._align(sources, texts)
                from ..attention.alignment import format_pharaoh

                alignments = [format_pharaoh(x) for x in links]
            for row, k in enumerate(batch):
                hyps = []
                for r in range(options.n_best):
                    flat = row * options.n_best + r
                    hyps.append(
                        Hypothesis(
                            texts[flat],
                            None if logprobs is None else logprobs[flat],
                            None if normalised is None else normalised[flat],
                            None if alignments is None else alignments[flat],
                        )
                    )
                result[k] = hyps
        return result

    def _translate_ct2(self, sentences, ids, result):
        """The CTranslate2 path: its scores are the beam's normalised log p(y | x) / |y|^α only, so
        the total log-probability column is nan."""
        from .ct2 import translate_ct2

        keep = [k for k, row in enumerate(ids) if row]
        if not keep:
            return result
        kwargs = {k: v for k, v in self.kwargs.items() if k not in ("output_scores", "return_dict_in_generate")}
        found = translate_ct2(
            self.model,
            self.tokenizer,
            [sentences[k] for k in keep],
            batch_size=self.options.batch_size,
            max_batch_tokens=self.options.batch_tokens,
            max_source_length=self.limit,
            **kwargs,
        )
        for k, hyps in zip(keep, found):
            result[k] = [
                Hypothesis(
                    text.strip(),
                    float("nan") if self.options.scores else None,
                    score if self.options.scores else None,
                    None,
                )
                for text, score in hyps
            ]
        return result

    def sequence_scores(self, out) -> tuple[list[float], list[float]]:
        """(total log-probability, length-normalised score) of each returned sequence.

        The total is the sum of `compute_transition_scores` over the generated tokens up to and
        including the first ``</s>``; the normalised score is beam search's ``sequences_scores``
        where there is one, else total / length^α.
        """
        if getattr(out, "scores", None) is None:
            # Constrained beam search keeps each hypothesis's score only: log p / length^α, with
            # length the generated tokens up to and including </s>, so the total is score × length^α.
            generated = out.sequences[:, 1:]
            lengths = _generated_mask(generated, self.eos_ids, self.pad_id)
            if self.pad_id is not None and self.pad_id not in self.eos_ids:
                lengths &= generated != self.pad_id  # a hypothesis cut by the length limit, padded
            normalised = out.sequences_scores.float()
            total = normalised * lengths.sum(dim=1).clamp(min=1).float() ** self.length_penalty
            return total.tolist(), normalised.tolist()
        beam_indices = getattr(out, "beam_indices", None)
        transition = self.model.compute_transition_scores(
            out.sequences, out.scores, beam_indices, normalize_logits=beam_indices is None
        )  # (rows, new_tokens)
        generated = out.sequences[:, -transition.size(1) :]
        mask = _generated_mask(generated, self.eos_ids, self.pad_id)
        if beam_indices is not None:
            mask &= beam_indices[:, : transition.size(1)] >= 0
        total = (transition.float() * mask).sum(dim=1)
        if getattr(out, "sequences_scores", None) is not None:
            normalised = out.sequences_scores.float()
        else:
            normalised = total / mask.sum(dim=1).clamp(min=1).float() ** self.length_penalty
        return total.tolist(), normalised.tolist()

    def _align(self, sources: list[str], targets: list[str]):
        from ..attention.alignment import attention_alignments

        links = [set() for _ in sources]
        keep = [k for k, t in enumerate(targets) if t]
        if keep:
            found = attention_alignments(
                self.model,
                self.tokenizer,
                [sources[k] for k in keep],
                [targets[k] for k in keep],
                layer=self.options.align_layer,
                heads=self.options.align_heads,
                max_source_length=self.limit,
            )
            for k, x in zip(keep, found):
                links[k] = x
        return links


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
    """An output file opened for appending whole chunks (fsync'd), or a text stream."""

    def __init__(self, path: Path | None, stream: TextIO | None = None):
        self.path = path
        self.stream = stream
        self.handle = open(path, "ab") if path is not None else None

    def write(self, text: str) -> None:
        if self.handle is not None:
            self.handle.write(text.encode("utf-8"))
            self.handle.flush()
            os.fsync(self.handle.fileno())
        elif self.stream is not None:
            self.stream.write(text)
            self.stream.flush()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


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


def _distributed():
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
    or ``--align-heads``, or ``resume`` without an output file.
    """
    from tqdm.auto import tqdm

    rank, world, state = _distributed()
    stats = RunStats()
    done = 0
    if resume:
        if output is None:
            raise UserError("--resume needs --output FILE (the file to continue)")
        done, _ = complete_records(output, options.lines_per_source)
        if alignments is not None:
            align_done, _ = complete_records(alignments, options.lines_per_source if options.format == "tsv" else 1)
            done = min(done, align_done)
        if rank == 0:
            # Cut back to `done` complete sources in both files (a partial line, a source's first lines).
            _truncate_to(output, done, options.lines_per_source)
            if alignments is not None:
                _truncate_to(alignments, done, options.lines_per_source if options.format == "tsv" else 1)
    elif rank == 0:
        for path in (output, alignments):
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b"")
    if state is not None:
        state.wait_for_everyone()
    stats.skipped = done
    first_chunk = done // options.chunk_lines  # the chunk being written when the run stopped
    sink = _Sink(output, stream) if rank == 0 else None
    align_sink = _Sink(alignments) if (rank == 0 and alignments is not None) else None
    translator = ChunkTranslator(loaded, options, generate_kwargs)
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
                    sink.write(text)
                    if align_sink is not None:
                        align_sink.write(align_text)
                    bar.update(len(hyps))
                    written += len(hyps)
            if round_chunks < world:
                break
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


def warn_truncated(stats: RunStats, limit: int | None, prog: str) -> None:
    """The one warning about over-long lines (stderr)."""
    if stats.truncated:
        print(
            f"{prog}: warning: {stats.truncated} line(s) longer than {limit} tokens were truncated "
            f"(first: line {stats.first_truncated}); --no-truncate refuses them instead",
            file=sys.stderr,
        )


# ---------------------------------------------------------------------------------------------
# The translate command


def _parse_heads(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        heads = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"--align-heads {text!r}: give 0-based head indices separated by commas, e.g. 0,3") from None
    if not heads:
        raise UserError("--align-heads: give at least one head index, e.g. 0 or 0,3")
    return heads


def run_translate_command(parser, args, generate_kwargs: dict, load) -> int:
    """``attention-seq2seq translate``: arguments, stdin or ``--input`` → stdout or ``--output``.

    ``load(args)`` loads the model (cli._load). Every source goes through `translate_stream`.
    """
    fmt = resolve_format(args.n_best, args.scores, args.format)
    if args.resume and not (args.input and args.output):
        parser.error("--resume needs --input FILE and --output FILE")
    options = FileTranslationOptions(
        batch_size=args.batch_size,
        batch_tokens=args.batch_tokens,
        chunk_lines=args.chunk_lines,
        max_source_length=args.max_source_length,
        truncate=not args.no_truncate,
        n_best=args.n_best,
        scores=args.scores,
        format=fmt,
        align=bool(args.alignments),
        align_layer=args.align_layer,
        align_heads=_parse_heads(args.align_heads),
    )
    constraints_file = getattr(args, "constraints", None)
    if constraints_file and not (args.input or args.text):
        parser.error("--constraints pairs its lines with the input's: give --input FILE or the sentences as arguments")
    if constraints_file and generate_kwargs.get("do_sample"):
        parser.error("--constraints runs a beam search; it does not combine with --do-sample")
    if args.input:
        source = Path(args.input)
        if not source.is_file():
            raise UserError(f"--input: file not found: {args.input}")
        if args.output and Path(args.output).resolve() == source.resolve():
            raise UserError("--output is the --input file; choose another output file")
    rank, world, _ = _distributed()
    if world > 1 and args.device is None and torch.cuda.is_available():
        args.device = f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}"
    elif world > 1 and args.device is None:
        args.device = "cpu"
    loaded = load(args)
    if constraints_file:
        from .constraints import read_constraints_file

        n_lines = len(args.text) if args.text else count_lines(Path(args.input))
        options.constraints = read_constraints_file(constraints_file, loaded.tokenizer, n_lines)
    if world > 1 and rank == 0:
        print(
            f"{parser.prog}: translating with {world} processes (chunk c on rank c mod {world}; rank 0 writes)",
            file=sys.stderr,
        )
    from_file = bool(args.input)
    if args.text:
        lines: Iterable[str] = list(args.text)
        total = len(args.text)
    elif from_file:
        total = count_lines(Path(args.input))
        lines = open(args.input, encoding="utf-8", newline="")
    else:
        if sys.stdin.isatty():
            print(f"{parser.prog}: reading sentences from the terminal; end with Ctrl-D", file=sys.stderr)
        lines, total = sys.stdin, None
    stats = translate_stream(
        loaded,
        lines,
        options=options,
        generate_kwargs=generate_kwargs,
        output=Path(args.output) if args.output else None,
        stream=None if args.output else sys.stdout,
        alignments=Path(args.alignments) if args.alignments else None,
        resume=args.resume,
        total=total,
        progress=from_file and not args.no_progress,
    )
    if from_file:
        lines.close()
    if rank == 0:
        limit = options.max_source_length or model_source_limit(loaded.model, loaded.tokenizer)
        warn_truncated(stats, limit, parser.prog)
        if args.resume and stats.skipped:
            print(f"{parser.prog}: resumed after {stats.skipped} complete source(s) in {args.output}", file=sys.stderr)
    return 0
