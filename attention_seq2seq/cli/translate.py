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
    _load,
    _model_names,
    _positive_int,
    _quiet_library_progress,
    _read_text_file,
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
        help="Transformer: heads to average, 0-based, comma-separated (default: all)",
    )


# ---------------------------------------------------------------------------------------------
# translate


def cmd_translate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.text and args.input:
        parser.error("give the text as arguments or with --input, not both")
    generate_kwargs = _generation_kwargs(parser, args)
    from ..translation.files import run_translate_command  # streaming, n-best, alignments, resume, ranks

    return run_translate_command(parser, args, generate_kwargs, _load)


# ---------------------------------------------------------------------------------------------
# evaluate


def _test_set(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[str, list[str], list[str], str | None]:
    """(name, sources, references, target language) from --corpus/--split or --src/--ref."""
    if args.corpus and (args.src or args.ref):
        parser.error("give --corpus (with --split) or --src and --ref, not both")
    if args.corpus:
        from ..data import load_corpus

        _quiet_library_progress()
        splits, info = load_corpus(args.corpus, return_info=True)
        dataset = splits[args.split]
        sources, references = list(dataset["source"]), list(dataset["target"])
        name = args.name or f"{info.name}-{args.split}".replace(" ", "-")
        target_lang = args.target_lang or info.target_lang
    else:
        if not (args.src and args.ref):
            parser.error("the test set needs --corpus SPEC (with --split) or both --src FILE and --ref FILE")
        sources, references = _read_text_file(args.src, "--src"), _read_text_file(args.ref, "--ref")
        if len(sources) != len(references):
            raise UserError(f"--src has {len(sources)} lines but --ref has {len(references)}: {args.src}, {args.ref}")
        name = args.name or Path(args.src).stem
        target_lang = args.target_lang or (Path(args.ref).suffix.lstrip(".") or None)
    if args.limit:
        sources, references = sources[: args.limit], references[: args.limit]
    if not sources:
        raise UserError("the test set is empty")
    return name, sources, references, target_lang


def cmd_evaluate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.update_metrics and len(_model_names(args)) > 1:
        parser.error(
            "--update-metrics writes into one training run's metrics.json; an ensemble (-m given "
            "several times) belongs to none: use --output FILE"
        )
    generate_kwargs = _generation_kwargs(parser, args)
    name, sources, references, target_lang = _test_set(parser, args)
    # Every file to write is checked before the model translates anything: never over --src or
    # --ref, never two of them the same file, never into a folder or a read-only place.
    from ..common.durability import unwritable, writing
    from ..common.user_files import check_output_file

    files = {"--src": args.src, "--ref": args.ref}
    for option in ("--output", "--hypotheses", "--per-sentence"):
        value = getattr(args, option[2:].replace("-", "_"))
        if value is not None:
            check_output_file(value, option, inputs=files)
            files[option] = value
    loaded = _load(args)
    run_dir = loaded.location.run_dir
    if args.update_metrics and run_dir is None:
        parser.error("--update-metrics needs a training output folder as --model (one with metrics.json)")
    if args.update_metrics and (why := unwritable(run_dir)):
        raise UserError(f"--update-metrics: cannot write {run_dir / 'metrics.json'} ({why})")

    from ..translation.evaluate import evaluate_model, format_score_table, update_run_metrics, write_results

    scores, hypotheses = evaluate_model(
        loaded,
        sources,
        references,
        target_lang=target_lang,
        n_bootstrap=args.bootstrap or 1,
        batch_size=args.batch_size,
        max_batch_tokens=args.batch_tokens,
        max_source_length=args.max_source_length,
        progress=not args.no_progress,
        **generate_kwargs,
    )
    result = {
        "split": args.split if args.corpus else "files",
        **scores,
        "model": " + ".join(_model_names(args)),
        **({"ensemble_weights": loaded.model.config.weights} if loaded.location.kind == "ensemble" else {}),
        "source": args.corpus or str(args.src),
        "reference": args.corpus or str(args.ref),
    }
    results = {name: result}
    # The scores first: a write that fails below (a full disk) loses no result.
    print(format_score_table(results), flush=True)
    # Default: next to the run's metrics.json, never into the current folder (a checkout, say);
    # for an export, model folder or Hub id only with --output.
    output = (
        Path(args.output)
        if args.output is not None
        else (run_dir / f"eval_{name}.json" if run_dir is not None else None)
    )
    if output is not None and args.output is None and (why := unwritable(run_dir)):
        print(
            f"{parser.prog}: warning: cannot write {output} ({why}); give --output FILE to keep the scores",
            file=sys.stderr,
        )
        output = None
    # Each file is written whole through a temporary file and a rename: a full disk leaves the old one.
    unchanged = "the file is as it was before this run"
    if output is not None:
        with writing(output, "the scores", kept=unchanged):
            write_results(output, results)
    if args.hypotheses is not None:
        from ..common.user_files import write_whole

        with writing(args.hypotheses, "the translations", kept=unchanged):
            write_whole(args.hypotheses, "".join(h + "\n" for h in hypotheses))
    if args.per_sentence is not None:
        from ..translation.scores import write_sentence_scores

        with writing(args.per_sentence, "the sentence scores", kept=unchanged):
            write_sentence_scores(args.per_sentence, hypotheses, references, target_lang=target_lang)
    if args.update_metrics:
        with writing(run_dir / "metrics.json", "the scores"):
            update_run_metrics(run_dir, name, result)
    if output is not None:
        print(f"scores written to {output}", file=sys.stderr)
    elif args.output is None and run_dir is None:
        print(f"{parser.prog}: note: no JSON written (give --output FILE to keep the scores)", file=sys.stderr)
    return 0


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
