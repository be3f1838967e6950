"""The ``attention-seq2seq`` command: train, export, push, translate, evaluate, plot-attention,
average-checkpoints and finetune.

Each subcommand is a ``cmd_<name>(parser, args)`` function that wires the package's own functions
together (training/train.py, hub/, metrics.py, plotting.py,
training/averaging.py, training/finetune_trainer.py); heavy imports happen inside them so
``attention-seq2seq --help`` answers at once.

Errors the user can fix (a missing folder, a bad corpus spec, an offline push) print one line,
``attention-seq2seq <command>: error: <message>``, and exit with status 2, as argparse does for
bad options. Set ``ATTENTION_SEQ2SEQ_DEBUG=1`` to get the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Callable

from ..errors import UserError

PROG = "attention-seq2seq"

# ---------------------------------------------------------------------------------------------
# Help texts: every subcommand shows examples under --help.

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
"""

_EVALUATE_EPILOG = """\
The test set is a corpus spec and a split (--corpus/--split) or two line-aligned files
(--src/--ref). Scores are sacreBLEU's BLEU and chrF on detokenized output, with signatures;
--bootstrap adds a 95% confidence interval (Koehn 2004). To test whether two systems differ, give
both translation files to sacreBLEU's paired bootstrap: sacrebleu REF -i A B --paired-bs.

examples:
  attention-seq2seq evaluate -m runs/multi30k --corpus multi30k:../shared/data/multi30k --split test
  attention-seq2seq evaluate -m export/ --src test2016.de --ref test2016.en --num-beams 5 \\
      --output eval.json --hypotheses test2016.hyp.en
  attention-seq2seq evaluate -m runs/tatoeba --src test.zh --ref test.en --update-metrics
  attention-seq2seq evaluate -m runs/multi30k --corpus multi30k:../shared/data/multi30k --bootstrap 1000
"""

_PLOT_EPILOG = """\
Draws the cross-attention of one sentence: the RNN's alignment matrix, or each Transformer
layer's head average (and, unless --no-per-head, every head of each layer in
<output stem>_layer<L>_heads.png). Without --reference the model translates the source first.

examples:
  attention-seq2seq plot-attention -m runs/rnn-bahdanau --source "Ein Hund läuft im Schnee." \\
      --output dog.png
  attention-seq2seq plot-attention -m runs/transformer --source "Ein Hund läuft im Schnee." \\
      --reference "A dog runs in the snow." --output dog_forced.png
"""

_DEMO_EPILOG = """\
Starts the attention explorer on http://HOST:PORT (default 127.0.0.1:7860): translate a sentence
(greedy or beam search), see the beam's candidates, and the attention as heat-maps: cross-attention
per layer and head (or the mean over heads), the Transformer's encoder and decoder self-attention,
the RNN's alignment step by step, local attention's p_t and window, hard attention's choices.
Needs the demo extra: pip install 'attention-seq2seq[demo]'. Nothing is sent anywhere: no
analytics, no share link. docs/attention-explorer.md has the details.

examples:
  attention-seq2seq demo -m runs/multi30k
  attention-seq2seq demo -m export/multi30k --trust-remote-code --port 8080
"""

_AER_EPILOG = """\
Both files hold one sentence pair per line in Pharaoh format: 0-based source-target word links
i-j; the gold file marks possible links i?j (sure ones i-j). AER = 1 - (|A&S| + |A&P|) / (|A| + |S|)
(Och & Ney 2003), summed over the corpus. See docs/translate.md.

examples:
  attention-seq2seq translate -m runs/rnn -i test.de -o hyp.en --alignments hyp.align
  attention-seq2seq alignment-error-rate hyp.align --gold gold.align
  attention-seq2seq alignment-error-rate hyp.align --gold gold.align --json
  attention-seq2seq alignment-error-rate -m runs/transformer \
--gold data/alignments/multi30k-test2016-de-en/gold.align \\
      --src data/alignments/multi30k-test2016-de-en/test2016.first30.de \\
      --ref data/alignments/multi30k-test2016-de-en/test2016.first30.en
"""

_AVERAGE_EPILOG = """\
Checkpoints are folders holding model.safetensors (accelerator.save_state or save_pretrained
folders) or .safetensors files. The result is a complete model folder: the config, generation
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
  torchrun --nproc_per_node 4 -m attention_seq2seq.training.finetune_trainer --recipe ...
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

_EXPORT_EPILOG = """\
With --space the folder also gets app.py, attention_fonts.py and requirements.txt: the attention
explorer (`attention-seq2seq demo`), runnable there with only gradio, torch and transformers
(python app.py), or as a Hugging Face Space (docs/attention-explorer.md).

examples:
  attention-seq2seq export runs/multi30k --output export/multi30k
  attention-seq2seq export runs/multi30k --output export/multi30k --space --repo-id me/transformer-de-en
  attention-seq2seq export runs/ft-multi30k --output export/ft --repo-id me/transformer-de-en-ft
  attention-seq2seq export runs/multi30k --output export/native --format native
  attention-seq2seq export runs/multi30k --output export/ct2 --format ct2 --quantization int8
"""

_PUSH_EPILOG = """\
The token comes from HF_TOKEN or `hf auth login`. Offline, push stops at once with a message.

examples:
  attention-seq2seq push export/multi30k me/transformer-small-de-en --dry-run
  attention-seq2seq push export/multi30k me/transformer-small-de-en --private
"""


# ---------------------------------------------------------------------------------------------
# Argument helpers


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


def _add_model_argument(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument("--revision", help="Hub revision (branch, tag or commit) for a Hub id")


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
        "--max-source-length", metavar="N", type=_positive_int, help="truncate longer inputs to this many tokens"
    )


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


def _load(args: argparse.Namespace, **kwargs):
    from ..translation.loading import load_for_inference

    _quiet_library_progress()

    return load_for_inference(
        args.model, device=args.device, trust_remote_code=args.trust_remote_code, revision=args.revision, **kwargs
    )


def _read_text_file(path: str, option: str) -> list[str]:
    from ..translation.loading import read_lines

    file = Path(path)
    if not file.is_file():
        raise UserError(f"{option}: file not found: {path}")
    with open(file, encoding="utf-8") as handle:
        return read_lines(handle)


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


def format_score_table(results: dict[str, dict]) -> str:
    """A plain-text table of test-set scores (score ± 95% half-width if bootstrapped), then the signatures."""
    from ..translation.scores import format_score

    header = ("test set", "sentences", "beams", "BLEU", "chrF")
    rows = [
        (name, str(r["num_sentences"]), str(r.get("num_beams", "-")), format_score(r, "bleu"), format_score(r, "chrf"))
        for name, r in results.items()
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for name, r in results.items():
        lines.append(f"BLEU signature: {r['bleu_signature']}")
        lines.append(f"chrF signature: {r['chrf_signature']}")
    return "\n".join(lines)


def cmd_evaluate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    generate_kwargs = _generation_kwargs(parser, args)
    name, sources, references, target_lang = _test_set(parser, args)
    loaded = _load(args)
    if args.update_metrics and loaded.location.run_dir is None:
        parser.error("--update-metrics needs a training output folder as --model (one with metrics.json)")

    from ..translation.loading import translate
    from ..translation.scores import corpus_scores

    hypotheses = translate(
        loaded,
        sources,
        batch_size=args.batch_size,
        max_batch_tokens=args.batch_tokens,
        max_source_length=args.max_source_length,
        progress=not args.no_progress,
        **generate_kwargs,
    )
    scores = corpus_scores(hypotheses, references, target_lang=target_lang, n_bootstrap=args.bootstrap or 1)
    generation_config = loaded.model.generation_config
    result = {
        "split": args.split if args.corpus else "files",
        "num_sentences": len(sources),
        "num_beams": generate_kwargs.get("num_beams", generation_config.num_beams or 1),
        "max_new_tokens": generate_kwargs.get("max_new_tokens", generation_config.max_new_tokens),
        "length_penalty": generate_kwargs.get(
            "length_penalty", 1.0 if generation_config.length_penalty is None else generation_config.length_penalty
        ),
        **scores,
        "model": str(args.model),
        "source": args.corpus or str(args.src),
        "reference": args.corpus or str(args.ref),
    }
    results = {name: result}
    # Default: next to the run's metrics.json, never into the current folder (a checkout, say);
    # for an export, model folder or Hub id only with --output.
    run_dir = loaded.location.run_dir
    output = Path(args.output) if args.output else (run_dir / f"eval_{name}.json" if run_dir is not None else None)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if args.hypotheses:
        Path(args.hypotheses).write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    if args.update_metrics:
        metrics_file = loaded.location.run_dir / "metrics.json"
        metrics = json.loads(metrics_file.read_text(encoding="utf-8")) if metrics_file.is_file() else {}
        entry = {k: v for k, v in result.items() if k not in ("model", "source", "reference")}
        metrics.setdefault("test", {})[name] = entry
        metrics_file.write_text(json.dumps(metrics, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(format_score_table(results))
    if output is not None:
        print(f"scores written to {output}", file=sys.stderr)
    else:
        print(f"{parser.prog}: note: no JSON written (give --output FILE to keep the scores)", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------
# plot-attention


def cmd_plot_attention(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.output.suffix.lower() != ".png":
        parser.error(f"--output must be a .png file; got {args.output}")
    generate_kwargs = _generation_kwargs(parser, args)
    # Attention weights come from the eager attention path (SDPA does not return them).
    from ..translation.loading import locate_model

    if locate_model(args.model).kind == "ctranslate2":
        raise UserError(
            f"-m {args.model} is a CTranslate2 folder, which returns no attention weights; "
            "plot with the training folder or a remote/native export of the same model"
        )
    loaded = _load(args, attn_implementation="eager")

    from ..attention.plotting import plot_cross_attentions

    cross_attentions, src_tokens, tgt_tokens = sentence_attention(loaded, args.source, args.reference, generate_kwargs)
    written = plot_cross_attentions(
        cross_attentions, src_tokens, tgt_tokens, args.output.parent, args.output.stem, per_head=not args.no_per_head
    )
    for path in written:
        print(path)
    return 0


def sentence_attention(loaded, source: str, reference: str | None, generate_kwargs: dict):
    """Cross-attention of one sentence pair, by teacher forcing the reference or the model's output.

    Returns ``(layers, src_tokens, tgt_tokens)`` with each layer's weights as a numpy array
    ``(num_heads, tgt_len, src_len)``; row ``t`` is the attention while predicting ``tgt_tokens[t]``.
    """
    import torch

    model, tokenizer = loaded.model, loaded.tokenizer
    device = next(model.parameters()).device
    encoded = tokenizer([source], return_tensors="pt").to(device)
    with torch.inference_mode():
        if reference is not None:
            target_ids = tokenizer(text_target=[reference], return_tensors="pt")["input_ids"].to(device)
        else:
            generated = model.generate(**encoded, **generate_kwargs)[0]
            # Drop the decoder start token and any padding after </s>; keep </s> itself.
            ids = generated[1:].tolist()
            eos = model.generation_config.eos_token_id
            eos_ids = set(eos if isinstance(eos, list) else [eos])
            cut = next((i + 1 for i, t in enumerate(ids) if t in eos_ids), len(ids))
            target_ids = torch.tensor([ids[:cut]], device=device)
        outputs = model(
            input_ids=encoded["input_ids"],
            attention_mask=encoded["attention_mask"],
            labels=target_ids,
            output_attentions=True,
        )
    if not outputs.cross_attentions:
        raise UserError(f"model {loaded.location.model_path} returned no cross-attention weights")
    layers = [layer[0].float().cpu().numpy() for layer in outputs.cross_attentions]  # (num_heads, tgt_len, src_len)
    src_tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
    tgt_tokens = tokenizer.convert_ids_to_tokens(target_ids[0].tolist())
    return layers, src_tokens, tgt_tokens


# ---------------------------------------------------------------------------------------------
# demo


def cmd_demo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # before gradio is imported
    try:
        import gradio  # noqa: F401
    except ImportError:
        raise UserError("the demo needs gradio: pip install 'attention-seq2seq[demo]'") from None
    loaded = _load(args, attn_implementation="eager")  # eager attention returns the weights
    from ..attention.explorer import build_app, launch

    name = Path(str(args.model)).name or str(args.model)
    app = build_app(loaded.model, loaded.tokenizer, title=f"Attention explorer: {name}", example=args.example)
    print(
        f"{parser.prog}: serving {args.model} on http://{args.host}:{args.port} (Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )
    try:
        launch(app, port=args.port, host=args.host, quiet=True)
    except OSError as err:  # the port is taken, or the host is not an address of this machine
        raise UserError(
            f"--port {args.port} / --host {args.host}: cannot serve there ({err}); choose another "
            "port, e.g. --port 7861"
        ) from None
    return 0


# ---------------------------------------------------------------------------------------------
# alignment-error-rate


def cmd_alignment_error_rate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..attention.alignment import alignment_error_rate

    if bool(args.hypothesis) == bool(args.model):
        parser.error("give a HYPOTHESIS alignment file, or -m MODEL with --src and --ref (not both)")
    if args.model and not (args.src and args.ref):
        parser.error("-m MODEL aligns --src with --ref by teacher forcing; give both files")
    texts = {}
    files = [("--gold", args.gold)] + (
        [("HYPOTHESIS", args.hypothesis)] if args.hypothesis else [("--src", args.src), ("--ref", args.ref)]
    )
    for option, path in files:
        if not Path(path).is_file():
            raise UserError(f"{option}: file not found: {path}")
        texts[option] = Path(path).read_text(encoding="utf-8").splitlines()
    if args.hypothesis:
        rows = [
            (
                "file",
                alignment_error_rate(
                    texts["HYPOTHESIS"], texts["--gold"], hyp_name=args.hypothesis, gold_name=args.gold
                ),
            )
        ]
    else:
        from ..attention.alignment import model_alignments_by_layer

        if len(texts["--src"]) != len(texts["--ref"]):
            raise UserError(f"--src has {len(texts['--src'])} lines but --ref has {len(texts['--ref'])}")
        loaded = _load(args)
        heads = None
        if args.align_heads:
            from ..translation.files import _parse_heads

            heads = _parse_heads(args.align_heads)
        rows = []
        for layer, lines in model_alignments_by_layer(
            loaded.model, loaded.tokenizer, texts["--src"], texts["--ref"], layer=args.align_layer, heads=heads
        ):
            rows.append(
                (
                    f"layer {layer}",
                    alignment_error_rate(lines, texts["--gold"], hyp_name=f"layer {layer}", gold_name=args.gold),
                )
            )
    result = {
        name: {"aer": c.aer, "precision": c.precision, "recall": c.recall, "links": c.a, "sure_links": c.s}
        for name, c in rows
    }
    if args.json:
        print(json.dumps(result if args.model else result["file"], indent=2))
    else:
        for name, counts in rows:
            print(
                f"{name + ': ' if args.model else ''}AER {counts.aer:.4f}  precision {counts.precision:.4f}  "
                f"recall {counts.recall:.4f}  ({counts.a} links, {counts.s} sure gold links, "
                f"{len(texts['--gold'])} sentences)"
            )
    return 0


# ---------------------------------------------------------------------------------------------
# average-checkpoints


def _run_checkpoints(run: Path, last: int) -> list[Path]:
    """The ``last`` newest ``<run>/checkpoints/step_<N>`` folders, oldest first."""
    folder = run / "checkpoints"
    steps = []
    for path in folder.glob("step_*") if folder.is_dir() else []:
        suffix = path.name[len("step_") :]
        if path.is_dir() and suffix.isdigit():
            steps.append((int(suffix), path))
    if not steps:
        raise UserError(f"--run: no checkpoints/step_<N> folders in {run}")
    if len(steps) < last:
        raise UserError(f"--last {last}: {run} has only {len(steps)} checkpoints")
    return [path for _, path in sorted(steps)[-last:]]


def cmd_average_checkpoints(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if bool(args.checkpoints) == bool(args.run):
        parser.error("give checkpoint paths or --run RUN (with --last K), not both and not neither")
    if args.run:
        run = Path(args.run)
        if not run.is_dir():
            raise UserError(f"--run: folder not found: {run}")
        checkpoints = _run_checkpoints(run, args.last)
        config_from = args.config_from or str(run / "model")
    else:
        checkpoints = [Path(p) for p in args.checkpoints]
        if len(checkpoints) < 2:
            parser.error("give at least two checkpoints to average")
        config_from = args.config_from or str(checkpoints[0])

    from ..translation.loading import locate_model
    from ..training.averaging import average_checkpoints, load_averaged_weights

    _quiet_library_progress()
    location = locate_model(config_from)
    if location.kind == "hub":
        raise UserError(f"--config-from: folder not found: {config_from}")
    try:
        averaged = average_checkpoints(checkpoints)
    except FileNotFoundError as err:
        raise UserError(str(err)) from None

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig

    model = AutoModelForSeq2SeqLM.from_pretrained(location.model_path, trust_remote_code=args.trust_remote_code)
    try:
        load_averaged_weights(model, averaged)
    except RuntimeError as err:
        raise UserError(f"checkpoints do not fit the model of --config-from {config_from}: {err}") from None
    output = Path(args.output)
    model.save_pretrained(output)
    try:
        GenerationConfig.from_pretrained(location.model_path).save_pretrained(output)
    except OSError:
        pass  # no generation_config.json there: save_pretrained wrote the model's own
    try:
        AutoTokenizer.from_pretrained(location.model_path).save_pretrained(output)
    except (OSError, ValueError):
        print(f"{parser.prog}: note: no tokenizer in {location.model_path}; copy one into {output}", file=sys.stderr)
    print(f"averaged {len(checkpoints)} checkpoints into {output}:")
    for path in checkpoints:
        print(f"  {path}")
    return 0


# ---------------------------------------------------------------------------------------------
# finetune, train, export, push


def cmd_finetune(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..training.finetune_trainer import config_from_args, finetune, merge_adapter

    if args.merge_adapter:
        try:
            model_dir = merge_adapter(args.merge_adapter, base_model=args.base_model)
        except (FileExistsError, ImportError) as err:
            parser.error(str(err))
        print(f"merged model written to {model_dir}")
        return 0
    try:
        config = config_from_args(args)
    except (ValueError, TypeError, ImportError) as err:
        parser.error(str(err))
    try:
        output_dir = finetune(config)
    except FileExistsError as err:
        parser.error(str(err))
    written = "model" if (output_dir / "model").is_dir() else "adapter"
    print(f"fine-tuned {written} written to {output_dir / written}")
    return 0


def cmd_train(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..training.train import main as train_main

    train_main(["--help"] if args.help_train else args.train_args)
    return 0


def cmd_export(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..hub.export import ExportError, export_model

    run = Path(args.run)
    if not run.is_dir():
        raise UserError(f"RUN: folder not found: {run}")
    if args.quantization is not None and args.format != "ct2":
        parser.error(f"--quantization only applies to --format ct2; got --format {args.format}")
    if args.format != "remote":
        for option in ("base_model", "license"):
            if getattr(args, option) is not None:
                parser.error(f"--{option.replace('_', '-')} only applies to --format remote (the card's metadata)")
        try:
            if args.format == "native":
                from ..hub.export_native import export_native

                out = export_native(run, Path(args.output), repo_id=args.repo_id, overwrite=args.overwrite)
            else:
                from ..hub.export_ct2 import export_ct2

                if args.repo_id is not None:
                    parser.error("--repo-id only applies to --format remote and native (the card)")
                out = export_ct2(
                    run, Path(args.output), quantization=args.quantization or "int8", overwrite=args.overwrite
                )
        except ExportError as err:
            raise UserError(str(err)) from None
        print(f"exported {run} to {out} ({args.format})")
        return 0
    base_model = args.base_model or recorded_base_model(run)
    try:
        out = export_model(
            run,
            Path(args.output),
            repo_id=args.repo_id,
            base_model=base_model,
            license=args.license,
            overwrite=args.overwrite,
            space=args.space,
        )
    except ExportError as err:
        raise UserError(str(err)) from None
    print(f"exported {run} to {out}" + (f" (base model {base_model})" if base_model else ""))
    return 0


def recorded_base_model(run: Path) -> str | None:
    """The Hub id a fine-tuned run recorded in its metrics.json as ``base_model``, if it is one.

    A local path there (a base that was never published) cannot go into the card's metadata.
    """
    from ..translation.loading import looks_like_hub_id

    metrics_file = run / "metrics.json"
    if not metrics_file.is_file():
        return None
    try:
        base = json.loads(metrics_file.read_text(encoding="utf-8")).get("base_model")
    except (json.JSONDecodeError, AttributeError):
        return None
    if isinstance(base, str) and base.count("/") == 1 and looks_like_hub_id(base):
        return base
    return None


def cmd_push(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..hub.push import PushError, push_to_hub

    try:
        result = push_to_hub(
            args.folder,
            args.repo_id,
            private=args.private,
            revision=args.revision,
            token=args.token,
            dry_run=args.dry_run,
            commit_message=args.commit_message,
        )
    except PushError as err:
        raise UserError(str(err)) from None
    print(result.describe())
    return 0


# ---------------------------------------------------------------------------------------------
# The parser


def build_parser(finetune_options: bool = True) -> argparse.ArgumentParser:
    """The command line's parser. ``finetune_options=False`` leaves out the options of ``finetune``
    (its configuration dataclass lives next to transformers' Trainer, whose import takes seconds);
    `main` asks for them only when the command line names ``finetune``."""
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

    # train: everything after the command goes to training/train.py.
    p = add("train", "train a model with Accelerate (training/train.py)", _TRAIN_EPILOG, cmd_train)
    p.add_argument("--help-train", action="store_true", help="show the training script's own options")
    # The training script's own options (--recipe FILE, --FIELD VALUE) are passed on unparsed.

    p = add("finetune", "fine-tune a model with transformers' Seq2SeqTrainer", _FINETUNE_EPILOG, cmd_finetune)
    if finetune_options:
        from ..training.config import field_comments
        from ..training.finetune_trainer import FinetuneConfig, add_config_arguments

        add_config_arguments(p, field_comments(FinetuneConfig))

    p = add("translate", "translate sentences from arguments, a file or stdin", _TRANSLATE_EPILOG, cmd_translate)
    _add_model_argument(p)
    p.add_argument(
        "text", nargs="*", metavar="TEXT", help="sentences to translate (default: --input or stdin, one per line)"
    )
    p.add_argument("-i", "--input", metavar="FILE", help="file with one sentence per line")
    p.add_argument("-o", "--output", metavar="FILE", help="write translations here (default: stdout)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr for --input")
    _add_generation_arguments(p)
    _add_file_translation_arguments(p)

    p = add("evaluate", "BLEU and chrF (sacreBLEU) of a model on a test set", _EVALUATE_EPILOG, cmd_evaluate)
    _add_model_argument(p)
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

    p = add("plot-attention", "attention heat-map (PNG) of one sentence", _PLOT_EPILOG, cmd_plot_attention)
    _add_model_argument(p)
    p.add_argument("--source", required=True, help="the source sentence")
    p.add_argument("--reference", help="teacher-force this translation instead of the model's own")
    p.add_argument("-o", "--output", type=Path, required=True, help="PNG file to write")
    p.add_argument("--no-per-head", action="store_true", help="Transformer: only the head average of each layer")
    _add_generation_arguments(p, sampling=False)

    p = add("demo", "attention explorer in the browser (Gradio)", _DEMO_EPILOG, cmd_demo)
    _add_model_argument(p)
    p.add_argument("--port", type=_positive_int, default=7860, help="port to serve on (default: 7860)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to serve on (default: 127.0.0.1, this machine only; 0.0.0.0 for all)",
    )
    p.add_argument("--example", help="sentence to put in the source box")
    p = add(
        "alignment-error-rate",
        "AER of Pharaoh word alignments against a gold file",
        _AER_EPILOG,
        cmd_alignment_error_rate,
    )
    p.add_argument(
        "hypothesis", metavar="HYPOTHESIS", nargs="?", help="Pharaoh file to score (e.g. from translate --alignments)"
    )
    p.add_argument("--gold", required=True, help="gold Pharaoh file: i-j sure links, i?j possible links")
    p.add_argument("--json", action="store_true", help="print the scores as JSON")
    model = p.add_argument_group("or align a model's attention: teacher-force --ref and score each layer")
    model.add_argument(
        "-m", "--model", metavar="MODEL", help="training output folder, export folder, model folder or Hub id"
    )
    model.add_argument("--src", help="source sentences, line-aligned with --gold")
    model.add_argument("--ref", help="target sentences the gold links refer to")
    model.add_argument(
        "--align-layer",
        metavar="L",
        type=int,
        help="only this decoder layer (0-based, -1 the last; default: every layer)",
    )
    model.add_argument("--align-heads", metavar="H[,H...]", help="heads to average (default: all)")
    model.add_argument("--device", help="cpu, cuda, cuda:1, mps")
    model.add_argument("--trust-remote-code", action="store_true", help="run the code shipped in an export")
    model.add_argument("--revision", help="Hub revision for a Hub id")

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
        help="also write app.py and requirements.txt: the attention explorer as a Gradio Space",
    )
    p.add_argument(
        "--format",
        choices=("remote", "native", "ct2"),
        default="remote",
        help="remote: our code shipped, loaded with trust_remote_code=True (default); native: a "
        "transformers class (Marian, Pegasus or Blenderbot), no code; ct2: a CTranslate2 model "
        "(docs/deploy.md)",
    )
    p.add_argument(
        "--quantization",
        choices=("int8", "int16", "float32", "bfloat16"),
        help="--format ct2: the stored weight type (default: int8)",
    )

    p = add("push", "upload an export folder to the Hugging Face Hub", _PUSH_EPILOG, cmd_push)
    from ..hub.push import build_parser as add_push_arguments

    add_push_arguments(p)
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


def main(argv: list[str] | None = None) -> int:
    words = dashed(sys.argv[1:] if argv is None else argv)
    parser = build_parser(finetune_options="finetune" in words)
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
    except (UserError, FileNotFoundError, NotADirectoryError, ValueError) as err:
        if os.environ.get("ATTENTION_SEQ2SEQ_DEBUG"):
            raise
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"{subparser.prog}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
