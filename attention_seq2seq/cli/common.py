"""What every command shares: one-line errors, argument types, the model and decoding options,
and loading a model the way every command loads it."""

from __future__ import annotations

import argparse
from typing import Callable

from ..common.errors import UserError


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``<prog>: error: <message>`` and exit status 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse prefixes the option's name to the message)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {value}")
    return value


def _resample_count(text: str) -> int:
    """argparse type for --bootstrap: at least 2 resamples (one resample gives no interval)."""
    value = _positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"needs at least 2 resamples for an interval (1000 is usual); got {value}")
    return value


def _float_in(low: float, high: float, *, low_open: bool = False) -> Callable[[str], float]:
    """argparse type: a float in [low, high], or (low, high] with ``low_open``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number; got {text!r}") from None
        if not ((value > low if low_open else value >= low) and value <= high):
            raise argparse.ArgumentTypeError(f"must be in {'(' if low_open else '['}{low}, {high}]; got {value}")
        return value

    return parse


def _weights(text: str) -> list[float]:
    """argparse type for --ensemble-weights: comma-separated non-negative numbers, not all 0."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers, one per -m, e.g. 0.6,0.4; got {text!r}")
    if any(not (v >= 0) or v == float("inf") for v in values) or sum(values) <= 0:
        raise argparse.ArgumentTypeError(f"must be finite numbers >= 0, not all 0; got {text!r}")
    return values


def _head_indices(text: str) -> list[int]:
    """argparse type for --align-heads: 0-based head indices separated by commas."""
    try:
        heads = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"give 0-based head indices separated by commas, e.g. 0,3; got {text!r}")
    if not heads:
        raise argparse.ArgumentTypeError("give at least one head index, e.g. 0 or 0,3")
    return heads


def _add_model_argument(parser: argparse.ArgumentParser, *, ensemble: bool = False) -> None:
    """-m MODEL and the loading options; with ``ensemble``, -m may be repeated (an ensemble of
    the models, ``args.model`` a list) and --ensemble-weights weighs them."""
    if ensemble:
        parser.add_argument(
            "-m",
            "--model",
            required=True,
            action="append",
            metavar="MODEL",
            help="training output folder, export folder, model folder or Hub id; give -m several "
            "times to decode with an ensemble (the mean of the models' log-probabilities per step)",
        )
        parser.add_argument(
            "--ensemble-weights",
            metavar="W[,W...]",
            type=_weights,
            help="one weight per -m, comma-separated (normalised to sum 1; default: equal)",
        )
    else:
        parser.add_argument(
            "-m",
            "--model",
            required=True,
            metavar="MODEL",
            help="training output folder, export folder, model folder or Hub id",
        )
    parser.add_argument("--device", help="cpu, cuda, cuda:1, mps (default: the first accelerator, else cpu)")
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the code shipped in an export instead of the installed package",
    )
    parser.add_argument(
        "--revision",
        help="Hub revision (branch, tag or commit) for a Hub id; with --trust-remote-code pin a commit "
        "whose .py files you have read (they run on this machine, and a branch can change under you)",
    )


def _add_generation_arguments(parser: argparse.ArgumentParser, *, sampling: bool = True) -> None:
    group = parser.add_argument_group("decoding (default: the model's generation_config)")
    group.add_argument("--num-beams", metavar="N", type=_positive_int, help="beam size")
    group.add_argument("--greedy", action="store_true", help="greedy search (beam size 1, no sampling)")
    group.add_argument(
        "--max-new-tokens",
        metavar="N",
        type=_positive_int,
        help="longest output in tokens (default: the model's generation_config)",
    )
    group.add_argument(
        "--length-penalty",
        metavar="ALPHA",
        type=_float_in(-10.0, 10.0),
        help="beam search: score = log-probability / length^ALPHA (default 1.0; 0: no "
        "normalisation; larger favours longer outputs, negative shorter ones)",
    )
    if sampling:
        group.add_argument("--do-sample", action="store_true", help="sample instead of searching")
        group.add_argument("--top-k", metavar="K", type=_positive_int, help="sample from the k likeliest tokens")
        group.add_argument(
            "--top-p",
            metavar="P",
            type=_float_in(0.0, 1.0, low_open=True),
            help="nucleus sampling: the smallest set with probability >= p",
        )
        group.add_argument(
            "--temperature",
            metavar="T",
            type=_float_in(0.0, 100.0, low_open=True),
            help="divide the logits by this before sampling",
        )
        group.add_argument("--seed", metavar="N", type=int, help="random seed (makes sampling repeatable)")
    group.add_argument(
        "--batch-size", metavar="N", type=_positive_int, default=32, help="sentences per batch (default: 32)"
    )
    group.add_argument(
        "--batch-tokens",
        metavar="N",
        type=_positive_int,
        help="batch by size instead: as many sentences as fit in N padded source tokens",
    )
    group.add_argument(
        "--max-source-length",
        metavar="N",
        type=_positive_int,
        help="cut longer inputs to this many tokens, keeping </s> (default: the model's limit)",
    )


def _generation_kwargs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """Check the decoding options against each other and build ``generate`` kwargs."""
    from ..translation.loading import generation_kwargs

    do_sample = getattr(args, "do_sample", False)
    if args.greedy and do_sample:
        parser.error("--greedy and --do-sample exclude each other; choose one")
    if args.greedy and args.num_beams not in (None, 1):
        parser.error(f"--greedy means --num-beams 1; got --num-beams {args.num_beams}")
    if args.length_penalty is not None and (args.greedy or do_sample or args.num_beams == 1):
        parser.error("--length-penalty only applies to beam search; drop it, or --greedy / --do-sample / --num-beams 1")
    for option in ("top_k", "top_p", "temperature"):
        if getattr(args, option, None) is not None and not do_sample:
            parser.error(f"--{option.replace('_', '-')} only applies with --do-sample")
    if getattr(args, "seed", None) is not None:
        import transformers

        transformers.set_seed(args.seed)  # Python, NumPy and torch (CPU and CUDA) generators
    return generation_kwargs(
        num_beams=args.num_beams,
        greedy=args.greedy,
        do_sample=do_sample,
        top_k=getattr(args, "top_k", None),
        top_p=getattr(args, "top_p", None),
        temperature=getattr(args, "temperature", None),
        max_new_tokens=args.max_new_tokens,
        length_penalty=args.length_penalty,
    )


def _quiet_library_progress() -> None:
    """Keep stderr for our own progress bar: no per-file bars from transformers and datasets."""
    import datasets
    import transformers

    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()


def _model_names(args: argparse.Namespace) -> list[str]:
    """The -m values as a list (one for a single model, several for an ensemble)."""
    return list(args.model) if isinstance(args.model, list) else [args.model]


def _load(args: argparse.Namespace, **kwargs):
    """Load -m (or, given several times, the ensemble of the -m models) as every command does."""
    from ..translation.loading import load_ensemble, load_for_inference

    _quiet_library_progress()
    names = _model_names(args)
    weights = getattr(args, "ensemble_weights", None)
    if len(names) > 1:
        return load_ensemble(
            names, weights=weights, device=args.device, trust_remote_code=args.trust_remote_code, revision=args.revision
        )
    if weights is not None:
        raise UserError("--ensemble-weights needs two or more models (-m A -m B)")
    return load_for_inference(
        names[0], device=args.device, trust_remote_code=args.trust_remote_code, revision=args.revision, **kwargs
    )


def _read_text_file(path: str, option: str) -> list[str]:
    from ..data.spec import text_lines
    from ..common.user_files import check_input_file

    return list(text_lines(check_input_file(path, option)))  # UTF-8 checked (file and line named), BOM and CRLF dropped
