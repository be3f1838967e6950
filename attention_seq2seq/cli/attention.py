"""The ``plot-attention``, ``demo`` and ``alignment-error-rate`` commands: parse, then call attention/."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..common.errors import UserError
from .common import (
    _add_generation_arguments,
    _add_model_argument,
    _generation_kwargs,
    _head_indices,
    _load,
    _positive_int,
)

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


# ---------------------------------------------------------------------------------------------
# plot-attention


def cmd_plot_attention(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.output.suffix.lower() != ".png":
        parser.error(f"--output must be a .png file; got {args.output}")
    generate_kwargs = _generation_kwargs(parser, args)
    # Attention weights come from the eager attention path (SDPA does not return them).
    from ..translation.engine import RUNTIME_NAMES
    from ..translation.loading import locate_model

    kind = locate_model(args.model).kind
    if kind in RUNTIME_NAMES:
        raise UserError(
            f"-m {args.model} is {RUNTIME_NAMES[kind]}, which returns no attention weights; "
            "plot with the training folder or a remote/native export of the same model"
        )
    loaded = _load(args, attn_implementation="eager")
    from ..attention.forced import plot_sentence_attention

    written = plot_sentence_attention(
        loaded, args.source, args.reference, generate_kwargs, args.output, per_head=not args.no_per_head
    )
    for path in written:
        print(path)
    return 0


# ---------------------------------------------------------------------------------------------
# demo


def cmd_demo(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # before gradio is imported
    try:
        import gradio  # noqa: F401
    except ImportError:
        raise UserError("the demo needs gradio: pip install 'attention-seq2seq[demo]'") from None
    loaded = _load(args, attn_implementation="eager")  # eager attention returns the weights
    from ..explorer_app import build_app, launch

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
    from ..attention.alignment import read_aer_files, score_aer_files

    if bool(args.hypothesis) == bool(args.model):
        parser.error("give a HYPOTHESIS alignment file, or -m MODEL with --src and --ref (not both)")
    if args.model and not (args.src and args.ref):
        parser.error("-m MODEL aligns --src with --ref by teacher forcing; give both files")
    files = read_aer_files(args.gold, hypothesis=args.hypothesis, src=args.src, ref=args.ref)
    model = tokenizer = None
    if args.model:
        loaded = _load(args)
        model, tokenizer = loaded.model, loaded.tokenizer
    report = score_aer_files(files, model, tokenizer, layer=args.align_layer, heads=args.align_heads)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print("\n".join(report.lines()))
    return 0


def add_commands(add) -> None:
    """Add this module's commands; ``add(name, help, epilog, handler)`` returns the subparser."""
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
    model.add_argument("--align-heads", metavar="H[,H...]", type=_head_indices, help="heads to average (default: all)")
    model.add_argument("--device", help="cpu, cuda, cuda:1, mps")
    model.add_argument("--trust-remote-code", action="store_true", help="run the code shipped in an export")
    model.add_argument(
        "--revision",
        help="Hub revision for a Hub id; with --trust-remote-code pin a commit whose .py files you have "
        "read (they run on this machine, and a branch can change under you)",
    )
