"""The ``attention-seq2seq`` command: train, export, push, translate, evaluate, plot-attention,
average-checkpoints and finetune.

One module per command group, each adding its subcommands (``add_commands``) and a
``cmd_<name>(parser, args)`` handler per command that parses and calls the package's own functions:
``training.py`` (train, finetune, average-checkpoints), ``translate.py`` (translate, evaluate),
``attention.py`` (plot-attention, demo, alignment-error-rate), ``hub.py`` (export, push);
``common.py`` holds what they share. Heavy imports happen inside the handlers, so
``attention-seq2seq --help`` answers at once.

Errors the user can fix (a missing folder, a bad corpus spec, an offline push) print one line,
``attention-seq2seq <command>: error: <message>``, and exit with status 2, as argparse does for
bad options. Set ``ATTENTION_SEQ2SEQ_DEBUG=1`` to get the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..common.durability import DiskFullError, LockedError
from ..common.errors import UserError
from . import attention, hub, training, translate
from .common import _Parser

PROG = "attention-seq2seq"

# ---------------------------------------------------------------------------------------------
# Help texts: every subcommand shows examples under --help (each next to its command).

_MAIN_EPILOG = """\
commands:
  train                 train a model with Accelerate (one CPU to many GPUs)
  finetune              fine-tune a trained or exported model with transformers' Seq2SeqTrainer
  translate             translate text from arguments, a file or stdin
  evaluate              BLEU and chrF (sacreBLEU) of a model on a test set
  plot-attention        attention heat-map of one sentence
  demo                  attention explorer in the browser (Gradio; pip install '.[demo]')
  alignment-error-rate  AER of Pharaoh word alignments against a gold file
  average-checkpoints   average the weights of k checkpoints into one model
  export                turn a training folder into a Hub-ready folder (remote code + card)
  push                  upload an export folder to the Hugging Face Hub

examples:
  attention-seq2seq train --recipe training/recipes/multi30k-transformer-small.yaml
  echo "Ein Hund läuft im Schnee." | attention-seq2seq translate -m runs/multi30k
  attention-seq2seq evaluate -m runs/multi30k --corpus multi30k:../shared/data/multi30k --split test
  attention-seq2seq <command> --help
"""


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser."""
    parser = _Parser(
        prog=PROG,
        description="The classic attention models for sequence-to-sequence learning, as transformers models.",
        epilog=_MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def add(name: str, help_text: str, epilog: str, handler) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(handler=handler)
        return p

    # The order of `attention-seq2seq --help`: training, translation, attention, the Hub.
    training.add_commands(add)
    translate.add_commands(add)
    attention.add_commands(add)
    training.add_averaging_command(add)
    hub.add_commands(add)
    return parser


def dashed(words: list[str]) -> list[str]:
    """The command line with every option written the documented way: ``--max_new_tokens=5`` ->
    ``--max-new-tokens=5`` (values, and words that are not options, unchanged). Every command
    thus takes both spellings, as the training script always has."""
    out = []
    for word in words:
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word.partition("=")
            word = name.replace("_", "-") + eq + value
        out.append(word)
    return out


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def main(argv: list[str] | None = None) -> int:
    words = dashed(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(words)
    if args.command == "train":
        args.train_args = unknown
        unknown = []
    elif args.command == "translate":
        # argparse gives a "*" positional only the words before the first option; the sentences
        # after an option come back here, in order.
        args.text += [word for word in unknown if not word.startswith("-")]
        unknown = [word for word in unknown if word.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    subparser = parser._subparsers._group_actions[0].choices[args.command]  # for one-line errors
    try:
        return args.handler(subparser, args)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        print(f"{subparser.prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`... | head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (UserError, FileNotFoundError, NotADirectoryError, ValueError, LockedError, DiskFullError) as err:
        if os.environ.get("ATTENTION_SEQ2SEQ_DEBUG"):
            raise
        print(f"{subparser.prog}: error: {_first_line(err)}", file=sys.stderr)
        return 2
    except OSError as err:  # the system refused a file (permissions, a read-only disk, a folder for a file)
        if os.environ.get("ATTENTION_SEQ2SEQ_DEBUG"):
            raise
        named = err.filename2 or err.filename  # a rename's target (filename2) is the file the user knows
        where = f"{named}: " if named else ""
        print(f"{subparser.prog}: error: {where}{err.strerror or _first_line(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
