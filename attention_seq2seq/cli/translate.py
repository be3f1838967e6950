"""The ``translate`` and ``evaluate`` commands: parse, then call translation/."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..common.errors import UserError
from .common import (
    _add_generation_arguments,
    _add_model_argument,
    _generation_kwargs,
    _head_indices,
    _load,
    _model_names,
    _positive_int,
    _quiet_library_progress,
    _resample_count,
)

_TRANSLATE_EPILOG = """\
MODEL (-m) is a training output folder, an export folder (remote code, native or CTranslate2),
a model folder or a Hub id.

examples:
  attention-seq2seq translate -m runs/multi30k "Ein Hund läuft im Schnee." "Zwei Männer lachen."
  echo "Ein Hund läuft im Schnee." | attention-seq2seq translate -m runs/multi30k
  attention-seq2seq translate -m runs/multi30k --input test.de --output test.hyp.en --num-beams 5
  attention-seq2seq translate -m someone/rnn-bahdanau-de-en --input test.de --greedy
  attention-seq2seq translate -m export/ --do-sample --top-p 0.9 --temperature 0.8 --seed 1 "Hallo!"
  attention-seq2seq translate -m export-ct2/ --input test.de --num-beams 5 --batch-tokens 2048
  attention-seq2seq translate -m export-ct2/ --n-best 3 "Ein Hund läuft im Schnee."
  attention-seq2seq translate -m export-onnx/ --input test.de --num-beams 5      # export --format onnx
  attention-seq2seq translate -m runs/a -m runs/b --input test.de --num-beams 5       # an ensemble
  attention-seq2seq translate -m runs/a -m runs/b --ensemble-weights 0.7,0.3 "Hallo!"
  attention-seq2seq translate -m runs/multi30k --input test.de --constraints terms.tsv --num-beams 5
"""

_EVALUATE_EPILOG = """\
The test set is a corpus spec and a split (--corpus/--split) or two line-aligned files
(--src/--ref). Scores are sacreBLEU's BLEU, chrF and TER on detokenized output, with signatures;
--bootstrap adds a 95% confidence interval (Koehn 2004). To test whether two systems differ, give
both translation files to sacreBLEU's paired bootstrap: sacrebleu REF -i A B --paired-bs.

examples:
  attention-seq2seq evaluate -m runs/multi30k --corpus multi30k:../shared/data/multi30k --split test
  attention-seq2seq evaluate -m export/ --src test2016.de --ref test2016.en --num-beams 5 \\
      --output eval.json --hypotheses test2016.hyp.en
  attention-seq2seq evaluate -m runs/tatoeba --src test.zh --ref test.en --update-metrics
  attention-seq2seq evaluate -m runs/multi30k --corpus multi30k:../shared/data/multi30k --bootstrap 1000
  attention-seq2seq evaluate -m runs/a -m runs/b --src test.de --ref test.en --output ensemble.json
  attention-seq2seq evaluate -m runs/multi30k --src test.de --ref test.en --per-sentence scores.tsv
"""


def _add_file_translation_arguments(parser: argparse.ArgumentParser) -> None:
    """translate's options for large files, n-best lists and alignments (docs/translate.md)."""
    group = parser.add_argument_group("files, n-best lists and alignments (docs/translate.md)")
    group.add_argument(
        "--chunk-lines",
        metavar="N",
        type=_positive_int,
        default=10_000,
        help="lines read, sorted and written at a time (default: 10000); memory holds one chunk",
    )
    group.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run: keep the complete records already in --output",
    )
    group.add_argument(
        "--no-truncate",
        action="store_true",
        help="refuse a line longer than the model's limit (default: truncate it, with one warning)",
    )
    group.add_argument(
        "--n-best",
        metavar="K",
        type=_positive_int,
        default=1,
        help="K hypotheses per source (beam search with at least K beams)",
    )
    group.add_argument(
        "--scores", action="store_true", help="add each hypothesis's total log-probability and length-normalised score"
    )
    group.add_argument(
        "--format",
        choices=["text", "tsv", "jsonl"],
        help="output format (default: text; tsv with --n-best > 1 or --scores)",
    )
    group.add_argument(
        "--constraints",
        metavar="FILE",
        help="terminology constraints: line i lists, tab-separated, target phrases that the translation of "
        "input line i must contain (an empty line: none); lexically constrained beam search (Post & Vilar 2018)",
    )
    group.add_argument(
        "--alignments",
        metavar="FILE",
        help="write Pharaoh word alignments (i-j) from attention to FILE, one line per output line",
    )
    group.add_argument(
        "--align-layer",
        metavar="L",
        type=int,
        default=-1,
        help="Transformer: decoder layer whose cross-attention aligns (0-based; default -1, the last)",
    )
    group.add_argument(
        "--align-heads",
        metavar="H[,H...]",
        type=_head_indices,
        help="Transformer: heads to average, 0-based, comma-separated (default: all)",
    )


# ---------------------------------------------------------------------------------------------
# translate


def cmd_translate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Arguments, stdin or ``--input`` → stdout or ``--output``, through `translate_stream`."""
    from ..translation.files import FileTranslationOptions, process_device, process_group, resolve_format

    if args.text and args.input:
        parser.error("give the text as arguments or with --input, not both")
    if args.resume and not (args.input and args.output is not None):
        parser.error("--resume needs --input FILE and --output FILE")
    if args.constraints and not (args.input or args.text):
        parser.error("--constraints pairs its lines with the input's: give --input FILE or the sentences as arguments")
    generate_kwargs = _generation_kwargs(parser, args)
    if args.constraints and generate_kwargs.get("do_sample"):
        parser.error("--constraints runs a beam search; it does not combine with --do-sample")
    options = FileTranslationOptions(
        batch_size=args.batch_size,
        batch_tokens=args.batch_tokens,
        chunk_lines=args.chunk_lines,
        max_source_length=args.max_source_length,
        truncate=not args.no_truncate,
        n_best=args.n_best,
        scores=args.scores,
        format=resolve_format(args.n_best, args.scores, args.format),
        align=args.alignments is not None,
        align_layer=args.align_layer,
        align_heads=args.align_heads,
    )
    input_lines = _check_translate_files(args)
    args.device = process_device(args.device)
    loaded = _load(args)
    if args.constraints:
        from ..translation.files import read_constraints_file

        n_lines = len(args.text) if args.text else input_lines
        options.constraints = read_constraints_file(args.constraints, loaded.tokenizer, n_lines)
    rank, world, _ = process_group()
    if world > 1 and rank == 0:
        print(
            f"{parser.prog}: translating with {world} processes (chunk c on rank c mod {world}; rank 0 writes)",
            file=sys.stderr,
        )
    from ..data.spec import decoded_lines, text_lines
    from ..translation.files import model_source_limit, translate_stream

    if args.text:
        lines, total = list(args.text), len(args.text)
    elif args.input:
        lines, total = text_lines(args.input), input_lines  # UTF-8 checked (file and line named), BOM and CRLF dropped
    else:
        if sys.stdin.isatty():
            print(f"{parser.prog}: reading sentences from the terminal; end with Ctrl-D", file=sys.stderr)
        # bytes, decoded here: a bad line is named like a file's, whatever the locale's encoding
        lines, total = decoded_lines(getattr(sys.stdin, "buffer", None) or sys.stdin, "standard input"), None
    stats = translate_stream(
        loaded,
        lines,
        options=options,
        generate_kwargs=generate_kwargs,
        output=Path(args.output) if args.output is not None else None,
        stream=None if args.output is not None else sys.stdout,
        alignments=Path(args.alignments) if args.alignments is not None else None,
        resume=args.resume,
        total=total,
        progress=bool(args.input) and not args.no_progress,
    )
    if args.input:
        lines.close()
    if rank == 0 and stats.truncated:
        limit = options.max_source_length or model_source_limit(loaded.model, loaded.tokenizer)
        print(
            f"{parser.prog}: warning: {stats.truncated} line(s) longer than {limit} tokens were truncated "
            f"(first: line {stats.first_truncated}); --no-truncate refuses them instead",
            file=sys.stderr,
        )
    if rank == 0 and args.resume and stats.skipped:
        print(f"{parser.prog}: resumed after {stats.skipped} complete source(s) in {args.output}", file=sys.stderr)
    return 0


def _check_translate_files(args: argparse.Namespace) -> int | None:
    """Check every file translate is given before the model loads and before an output is
    truncated: a mistake is one line, and no file is lost (common/user_files.py). Returns the
    --input file's lines (counted once: the constraints' pairing and the progress bar)."""
    from ..data.spec import check_text_file
    from ..common.user_files import check_input_file, check_output_file
    from ..translation.files import count_lines

    input_lines = None
    if args.input is not None:
        check_input_file(args.input, "--input", stdin_hint=True)
        check_text_file(args.input)  # UTF-8 throughout (file, line and column named), before -o is emptied
        input_lines = count_lines(Path(args.input))
    if args.constraints is not None:
        check_input_file(args.constraints, "--constraints")
        check_text_file(args.constraints)  # not UTF-8: the file, line and column named
    if args.output is not None:
        check_output_file(args.output, "--output", inputs={"--input": args.input, "--constraints": args.constraints})
    if args.alignments is not None:
        named = {"--input": args.input, "--output": args.output, "--constraints": args.constraints}
        check_output_file(args.alignments, "--alignments", inputs=named)
    return input_lines


# ---------------------------------------------------------------------------------------------
# evaluate


def cmd_evaluate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..common.durability import unwritable
    from ..translation.evaluate import evaluate_test_set, format_score_table, read_test_set, write_evaluation

    names = _model_names(args)
    if args.update_metrics and len(names) > 1:
        parser.error(
            "--update-metrics writes into one training run's metrics.json; an ensemble (-m given "
            "several times) belongs to none: use --output FILE"
        )
    generate_kwargs = _generation_kwargs(parser, args)
    if args.corpus:
        _quiet_library_progress()
    test_set = read_test_set(
        corpus=args.corpus,
        split=args.split,
        src=args.src,
        ref=args.ref,
        name=args.name,
        target_lang=args.target_lang,
        limit=args.limit,
    )
    _check_evaluate_outputs(args)
    loaded = _load(args)
    run_dir = loaded.location.run_dir
    if args.update_metrics and run_dir is None:
        parser.error("--update-metrics needs a training output folder as --model (one with metrics.json)")
    if args.update_metrics and (why := unwritable(run_dir)):
        raise UserError(f"--update-metrics: cannot write {run_dir / 'metrics.json'} ({why})")
    result, hypotheses = evaluate_test_set(
        loaded,
        test_set,
        model=" + ".join(names),
        n_bootstrap=args.bootstrap or 1,
        batch_size=args.batch_size,
        max_batch_tokens=args.batch_tokens,
        max_source_length=args.max_source_length,
        progress=not args.no_progress,
        **generate_kwargs,
    )
    # The scores first: a write that fails below (a full disk) loses no result.
    print(format_score_table({test_set.name: result}), flush=True)
    # Default: next to the run's metrics.json, never into the current folder (a checkout, say);
    # for an export, model folder or Hub id only with --output.
    output = Path(args.output) if args.output is not None else None
    if output is None and run_dir is not None:
        output = run_dir / f"eval_{test_set.name}.json"
        if why := unwritable(run_dir):
            print(
                f"{parser.prog}: warning: cannot write {output} ({why}); give --output FILE to keep the scores",
                file=sys.stderr,
            )
            output = None
    write_evaluation(
        test_set,
        result,
        hypotheses,
        output=output,
        hypotheses_file=args.hypotheses,
        per_sentence=args.per_sentence,
        run_dir=run_dir if args.update_metrics else None,
    )
    if output is not None:
        print(f"scores written to {output}", file=sys.stderr)
    elif args.output is None and run_dir is None:
        print(f"{parser.prog}: note: no JSON written (give --output FILE to keep the scores)", file=sys.stderr)
    return 0


def _check_evaluate_outputs(args: argparse.Namespace) -> None:
    """Every file to write is checked before the model translates anything: never over --src or
    --ref, never two of them the same file, never into a folder or a read-only place."""
    from ..common.user_files import check_output_file

    files = {"--src": args.src, "--ref": args.ref}
    for option in ("--output", "--hypotheses", "--per-sentence"):
        value = getattr(args, option[2:].replace("-", "_"))
        if value is not None:
            check_output_file(value, option, inputs=files)
            files[option] = value


def add_commands(add) -> None:
    """Add this module's commands; ``add(name, help, epilog, handler)`` returns the subparser."""
    p = add("translate", "translate sentences from arguments, a file or stdin", _TRANSLATE_EPILOG, cmd_translate)
    _add_model_argument(p, ensemble=True)
    p.add_argument(
        "text", nargs="*", metavar="TEXT", help="sentences to translate (default: --input or stdin, one per line)"
    )
    p.add_argument("-i", "--input", metavar="FILE", help="file with one sentence per line")
    p.add_argument("-o", "--output", metavar="FILE", help="write translations here (default: stdout)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr for --input")
    _add_generation_arguments(p)
    _add_file_translation_arguments(p)

    p = add("evaluate", "BLEU, chrF and TER (sacreBLEU) of a model on a test set", _EVALUATE_EPILOG, cmd_evaluate)
    _add_model_argument(p, ensemble=True)
    test = p.add_argument_group("test set")
    test.add_argument("--corpus", help="corpus spec, e.g. multi30k:../shared/data/multi30k or tsv:test.tsv")
    test.add_argument(
        "--split", default="test", choices=["train", "validation", "test"], help="split of --corpus (default: test)"
    )
    test.add_argument("--src", help="source file, one sentence per line")
    test.add_argument("--ref", help="reference file, line-aligned with --src")
    test.add_argument("--name", help="test set name in the JSON (default: from the spec or --src)")
    test.add_argument(
        "--target-lang",
        help="target language code; zh/ja/ko switch BLEU's tokenizer "
        "(default: from the corpus, or the --ref file suffix)",
    )
    test.add_argument("--limit", metavar="N", type=_positive_int, help="score only the first N sentences")
    test.add_argument(
        "--max-test-samples", dest="limit", type=_positive_int, help=argparse.SUPPRESS
    )  # the trainers' name
    out = p.add_argument_group("output")
    out.add_argument(
        "-o",
        "--output",
        help="JSON file (default: <run>/eval_<name>.json for a training output folder; none for other models)",
    )
    out.add_argument("--hypotheses", help="also write the translations to this file")
    out.add_argument(
        "--per-sentence",
        metavar="FILE",
        help="also write one TSV row per test sentence: index, sentence BLEU, chrF, TER, hypothesis, "
        "reference (as sacrebleu REF -i HYP -sl -m bleu chrf ter; for error analysis and filtering)",
    )
    out.add_argument(
        "--update-metrics",
        action="store_true",
        help="add the scores to MODEL's metrics.json (a training folder), for the model card",
    )
    out.add_argument(
        "--bootstrap",
        metavar="N",
        type=_resample_count,
        help="also each score's 95%% confidence interval from N bootstrap resamples of the test "
        "sentences (sacreBLEU, seeded; 1000 is usual): the JSON gains bleu_ci95 etc. (half-widths)",
    )
    out.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    _add_generation_arguments(p, sampling=False)
