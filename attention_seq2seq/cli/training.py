"""The ``train``, ``finetune`` and ``average-checkpoints`` commands: parse, then call training/."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from .common import (
    _positive_int,
    _quiet_library_progress,
)

_AVERAGE_EPILOG = """\
Checkpoints are folders holding model.safetensors (accelerator.save_state or save_pretrained
folders; a folder saved with max_shard_size is read through its model.safetensors.index.json,
as from_pretrained reads it) or .safetensors files. The result is a complete model folder: the config, generation
config and tokenizer come from --config-from (default: <run>/model with --run, else the first
checkpoint).

examples:
  attention-seq2seq average-checkpoints --run runs/transformer --last 5 --output runs/transformer/avg5
  attention-seq2seq average-checkpoints runs/t/checkpoints/step_9000 runs/t/checkpoints/step_10000 \\
      --config-from runs/t/model --output averaged/
"""

_FINETUNE_EPILOG = """\
Every field of the recipe is also an option (--field-name VALUE); options override the recipe.
Writes the usual training folder (model/, metrics.json with base_model, recipe.yaml), which
`attention-seq2seq export` turns into a Hub repo whose card names the base model.
With --lora only LoRA adapters train (peft: pip install 'attention-seq2seq[lora]'); the run writes
adapter/ and, with --merge, model/: the merged plain model, exported like a full fine-tune.
An output folder that holds a run is never overwritten: --resume continues its checkpoints.

examples:
  attention-seq2seq finetune --recipe training/recipes/finetune-bible-multi30k.yaml
  attention-seq2seq finetune --base-model runs/bible-transformer --corpus multi30k:../shared/data/multi30k \\
      --max-train-samples 2000 --max-steps 500 --output-dir runs/ft-multi30k
  attention-seq2seq finetune --base-model export/ --trust-remote-code --train-file train.jsonl \\
      --validation-file dev.jsonl --output-dir runs/ft --gradient-checkpointing
  attention-seq2seq finetune --recipe training/recipes/finetune-bible-multi30k-lora.yaml   # LoRA, merged
  attention-seq2seq finetune --recipe training/recipes/finetune-bible-multi30k.yaml --lora --lora-r 16 \\
      --learning-rate 1e-3 --output-dir runs/ft-lora          # writes adapter/ (add --merge for model/)
  attention-seq2seq finetune --merge-adapter runs/ft-lora      # later: adapter/ + base -> model/
  torchrun --nproc_per_node 4 -m attention_seq2seq.training.finetune_trainer --recipe ... --FIELD VALUE
"""

_TRAIN_EPILOG = """\
Runs training/train.py in this process (one CPU or one GPU). For several GPUs or machines use
Accelerate's launcher with the same options:
  accelerate launch -m attention_seq2seq.training.train --recipe ...

examples:
  attention-seq2seq train --recipe training/recipes/multi30k-transformer-small.yaml
  attention-seq2seq train --recipe training/recipes/bible-rnn-bahdanau.yaml --output_dir runs/rnn \\
      --max_time_minutes 30 --model_config.dropout 0.2
  attention-seq2seq train --help-train      # every field of the training script
"""


# ---------------------------------------------------------------------------------------------
# average-checkpoints


def cmd_average_checkpoints(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if bool(args.checkpoints) == bool(args.run):
        parser.error("give checkpoint paths or --run RUN (with --last K), not both and not neither")
    if not args.run and len(args.checkpoints) < 2:
        parser.error("give at least two checkpoints to average")
    from ..training.averaging import newest_checkpoints, write_averaged_model

    _quiet_library_progress()
    if args.run:
        checkpoints = newest_checkpoints(Path(args.run), args.last)
        config_from = args.config_from or str(Path(args.run) / "model")
    else:
        checkpoints = [Path(p) for p in args.checkpoints]
        config_from = args.config_from or str(checkpoints[0])
    notes = write_averaged_model(checkpoints, config_from, Path(args.output), trust_remote_code=args.trust_remote_code)
    for note in notes:
        print(f"{parser.prog}: note: {note}", file=sys.stderr)
    print(f"averaged {len(checkpoints)} checkpoints into {args.output}:")
    for path in checkpoints:
        print(f"  {path}")
    return 0


# ---------------------------------------------------------------------------------------------
# finetune, train, export, push


def cmd_finetune(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..training.config import FinetuneConfig, finetune_config
    from ..training.finetune_trainer import finetune, merge_adapter

    if args.merge_adapter:
        try:
            model_dir = merge_adapter(args.merge_adapter, base_model=args.base_model)
        except (FileExistsError, ImportError) as err:
            parser.error(str(err))
        print(f"merged model written to {model_dir}")
        return 0
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(FinetuneConfig)}
    try:  # finetune() checks the settings, peft and the output folder before it loads anything
        config = finetune_config(args.recipe, {name: value for name, value in given.items() if value is not None})
        output_dir = finetune(config)
    except (ValueError, ImportError, FileExistsError) as err:
        parser.error(str(err))
    written = "model" if (output_dir / "model").is_dir() else "adapter"
    print(f"fine-tuned {written} written to {output_dir / written}")
    return 0


def add_finetune_arguments(parser: argparse.ArgumentParser) -> None:
    """``--recipe``, ``--merge-adapter`` and one ``--field-name`` option per ``FinetuneConfig``
    field, with the field's comment as its help. Options left out stay ``None``, so the recipe's
    value (or the field's default) applies."""
    from ..training.config import FinetuneConfig, field_comments

    comments = field_comments(FinetuneConfig)
    parser.add_argument("--recipe", help="YAML or JSON file of fields; options given here override it")
    parser.add_argument(
        "--merge-adapter",
        metavar="RUN_DIR",
        help="merge the adapter of a finished LoRA run (RUN_DIR/adapter) into its base model and write "
        "RUN_DIR/model; --base-model overrides the base named in RUN_DIR/recipe.yaml; nothing is trained",
    )
    for f in dataclasses.fields(FinetuneConfig):
        flag = "--" + f.name.replace("_", "-")
        text = f"{comments[f.name]} " if comments.get(f.name) else ""
        if f.type in ("bool", bool):
            parser.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{text}(default: {f.default})",
            )
        else:
            kind = {"int": int, "float": float}.get(str(f.type), str)
            metavar = {int: "N", float: "X"}.get(kind, "TEXT")
            help_text = f"{text}(default: {f.default!r})".replace("%", "%%")
            parser.add_argument(flag, dest=f.name, type=kind, default=None, metavar=metavar, help=help_text)


def cmd_train(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..training.train import main as train_main

    train_main(["--help"] if args.help_train else args.train_args, prog=parser.prog)
    return 0


def add_commands(add) -> None:
    """Add this module's commands; ``add(name, help, epilog, handler)`` returns the subparser."""
    # train: everything after the command goes to training/train.py.
    p = add("train", "train a model with Accelerate (training/train.py)", _TRAIN_EPILOG, cmd_train)
    p.add_argument("--help-train", action="store_true", help="show the training script's own options")
    # The training script's own options (--recipe FILE, --FIELD VALUE) are passed on unparsed.

    p = add("finetune", "fine-tune a model with transformers' Seq2SeqTrainer", _FINETUNE_EPILOG, cmd_finetune)
    add_finetune_arguments(p)


def add_averaging_command(add) -> None:
    """``average-checkpoints`` (listed after the translation and attention commands)."""
    p = add(
        "average-checkpoints",
        "average the weights of k checkpoints into one model",
        _AVERAGE_EPILOG,
        cmd_average_checkpoints,
    )
    p.add_argument("checkpoints", nargs="*", metavar="CHECKPOINT", help="checkpoint folders or .safetensors files")
    p.add_argument("--run", help="a training output folder: average its newest checkpoints")
    p.add_argument("--last", metavar="K", type=_positive_int, default=5, help="with --run: how many (default: 5)")
    p.add_argument("--config-from", help="model folder giving config, generation config and tokenizer")
    p.add_argument("-o", "--output", required=True, help="folder for the averaged model")
    p.add_argument("--trust-remote-code", action="store_true", help="--config-from is an export: run its code")
