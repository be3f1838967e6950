"""The ``export`` and ``push`` commands: parse, then call hub/."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..common.errors import UserError

_EXPORT_EPILOG = """\
With --space the folder also gets app.py, space.json, requirements.txt and the explorer's
modules (explorer_app.py and what it imports): the attention explorer (`attention-seq2seq
demo`), runnable there with only gradio, torch and transformers (python app.py), or as a Hugging
Face Space (docs/attention-explorer.md).

examples:
  attention-seq2seq export runs/multi30k --output export/multi30k
  attention-seq2seq export runs/multi30k --output export/multi30k --space --repo-id me/transformer-de-en
  attention-seq2seq export runs/ft-multi30k --output export/ft --repo-id me/transformer-de-en-ft
  attention-seq2seq export runs/multi30k --output export/native --format native
  attention-seq2seq export runs/multi30k --output export/ct2 --format ct2 --quantization int8
  attention-seq2seq export runs/bible-rnn --output export/onnx --format onnx --check-sentences test.es
"""

_PUSH_EPILOG = """\
The token comes from HF_TOKEN or `hf auth login`. Offline, push stops at once with a message.

examples:
  attention-seq2seq push export/multi30k me/transformer-small-de-en --dry-run
  attention-seq2seq push export/multi30k me/transformer-small-de-en --private
"""


def cmd_export(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..hub.export import export_model

    run = Path(args.run)
    if not run.is_dir():
        raise UserError(f"RUN: folder not found: {run}")
    if args.quantization is not None and args.format not in ("ct2", "onnx"):
        parser.error(f"--quantization only applies to --format ct2 and onnx; got --format {args.format}")
    if args.check_sentences is not None and args.format != "onnx":
        parser.error(f"--check-sentences only applies to --format onnx; got --format {args.format}")
    if args.format != "remote":
        for option in ("base_model", "license"):
            if getattr(args, option) is not None:
                parser.error(f"--{option.replace('_', '-')} only applies to --format remote (the card's metadata)")
        if args.repo_id is not None and args.format in ("onnx", "ct2"):
            parser.error("--repo-id only applies to --format remote and native (the card)")
        if args.format == "native":
            from ..hub.export_native import export_native

            out = export_native(run, Path(args.output), repo_id=args.repo_id, overwrite=args.overwrite)
        elif args.format == "onnx":
            from ..hub.export_onnx import export_onnx

            sentences = None
            if args.check_sentences is not None:
                from .common import _read_text_file

                sentences = [
                    line for line in _read_text_file(args.check_sentences, "--check-sentences") if line.strip()
                ]
                if not sentences:
                    raise UserError(f"--check-sentences {args.check_sentences}: the file has no sentence")
            out = export_onnx(
                run,
                Path(args.output),
                quantization=args.quantization or "float32",
                sentences=sentences[:16] if sentences else None,
                overwrite=args.overwrite,
            )
        else:
            from ..hub.export_ct2 import export_ct2

            out = export_ct2(run, Path(args.output), quantization=args.quantization or "int8", overwrite=args.overwrite)
        print(f"exported {run} to {out} ({args.format})")
        return 0
    from ..hub.export import recorded_base_model

    base_model = args.base_model or recorded_base_model(run)
    out = export_model(
        run,
        Path(args.output),
        repo_id=args.repo_id,
        base_model=base_model,
        license=args.license,
        overwrite=args.overwrite,
        space=args.space,
    )
    print(f"exported {run} to {out}" + (f" (base model {base_model})" if base_model else ""))
    return 0


def cmd_push(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..hub.push import push_to_hub

    result = push_to_hub(
        args.folder,
        args.repo_id,
        private=args.private,
        revision=args.revision,
        token=args.token,
        dry_run=args.dry_run,
        commit_message=args.commit_message,
        pin_card=args.pin_card,
    )
    print(result.describe())
    return 0


def add_commands(add) -> None:
    """Add this module's commands; ``add(name, help, epilog, handler)`` returns the subparser."""
    p = add("export", "turn a training folder into a Hub-ready folder", _EXPORT_EPILOG, cmd_export)
    p.add_argument("run", metavar="RUN", help="training output folder (with model/ and metrics.json)")
    p.add_argument("-o", "--output", required=True, help="folder to write the export into")
    p.add_argument("--repo-id", help="the Hub repo id the card's snippets should name")
    p.add_argument(
        "--base-model",
        help="Hub id of the model this one was fine-tuned from "
        "(default: base_model in RUN/metrics.json when it is a Hub id)",
    )
    p.add_argument("--license", help="license id for the card (default: from the training corpus)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing export folder")
    p.add_argument(
        "--space",
        action="store_true",
        help="also write app.py, the explorer's modules and requirements.txt: the attention explorer as a Gradio Space",
    )
    p.add_argument(
        "--format",
        choices=("remote", "native", "ct2", "onnx"),
        default="remote",
        help="remote: our code shipped, loaded with trust_remote_code=True (default); native: a "
        "transformers class (Marian, Pegasus or Blenderbot), no code; ct2: a CTranslate2 model; "
        "onnx: encoder and decoder-step ONNX graphs for onnxruntime, both families (docs/deploy.md)",
    )
    p.add_argument(
        "--quantization",
        choices=("int8", "int16", "float32", "bfloat16"),
        help="--format ct2: the stored weight type (default: int8); --format onnx: float32 (default) "
        "or int8 (onnxruntime's dynamic quantization)",
    )
    p.add_argument(
        "--check-sentences",
        metavar="FILE",
        help="--format onnx: source sentences (one per line, the first 16) the export checks the ONNX "
        "graphs on against the PyTorch model (default: sentences made of the vocabulary)",
    )

    p = add("push", "upload an export folder to the Hugging Face Hub", _PUSH_EPILOG, cmd_push)
    p.add_argument("folder", help="folder written by `attention-seq2seq export`")
    p.add_argument("repo_id", help="Hub repository, e.g. user/rnn-de-en")
    p.add_argument("--private", action="store_true", help="create the repository as private")
    p.add_argument("--revision", help="branch to commit to (created if missing; default main)")
    p.add_argument("--token", help="Hub token (default: HF_TOKEN or the `hf auth login` cache)")
    p.add_argument("--dry-run", action="store_true", help="list the files and sizes; no network")
    p.add_argument("--commit-message", default="Upload model exported with attention_seq2seq")
    p.add_argument(
        "--no-pin-card",
        dest="pin_card",
        action="store_false",
        help="leave the card's REVISION placeholder as it is (by default a second commit sets it to the upload's "
        "commit, so the snippets users copy load the code uploaded)",
    )
