"""The attention explorer: a Gradio app that translates one sentence and shows its attention.

``attention-seq2seq demo -m MODEL`` serves it (cli/attention.py), and so does ``python app.py`` in
an export written with ``--space``, which ships this module and the ones it imports flat beside
``app.py`` (hub/space.py). It has a source box, the decoding settings (greedy, or beam search with
its size and length penalty) and Translate; it shows the translation, the beam's candidates with
their scores, and the attention as heat-maps over source and target subwords or words (the views
are attention/explorer.py's: cross-attention per layer and head or their mean, one step at a
time, local attention's p_t and window, hard attention's choices, the Transformer's
self-attention).

Everything is computed once per Translate by ``explain`` (attention/explorer.py); the pickers only
redraw. Each heat-map is an HTML table whose ``data-weights`` attribute holds the plotted array,
so a test (tests/test_explorer_browser.py) can read what the page shows.

Shipping: this module imports only the standard library, numpy, torch, transformers, gradio
(inside :func:`build_app` and :func:`launch`) and package modules that import no more, so the
Space runs where only the Hub packages are installed, loading the model through its shipped
remote code.
"""

from __future__ import annotations

import html
import json
import os
import time

import numpy as np

from .attention.explorer import (
    ALL_STEPS,
    CROSS,
    DECODER_SELF,
    ENCODER_SELF,
    MEAN_OVER_HEADS,
    SUBWORDS,
    WORDS,
    Explanation,
    HeatMap,
    describe_attention,
    explain,
    has_attention,
    select,
)
from .attention.fonts import css_font_family

# The Space's settings, written beside it by ``export --space`` (hub/space.py): {"model": Hub id or null}.
SPACE_SETTINGS = "space.json"


def heatmap_html(heatmap: HeatMap | None, message: str = "") -> str:
    """An HTML table: one cell per weight, shaded by weight / ``heatmap.scale`` (default: the largest
    weight); a one-row map (one decoder step) also prints each weight.

    The table's ``data-weights`` (JSON, 6 decimals) holds the plotted array, ``data-rows`` and
    ``data-cols`` its labels. Local windows outline the cells inside [p_t - D, p_t + D] and ring the
    cell nearest p_t; hard attention marks the chosen cell with a dot.
    """
    if heatmap is None:
        return f'<div class="attn-message">{html.escape(message)}</div>'
    w = heatmap.weights
    scale = max(heatmap.scale if heatmap.scale is not None else float(w.max()), 1e-9)
    one_row = w.shape[0] == 1
    marks = heatmap.marks
    out = [
        f'<div class="attn-title">{html.escape(heatmap.title)}</div>',
        (
            '<div class="attn-scroll"><table class="attn-map" style="font-family: {}" '
            'data-weights="{}" data-rows="{}" data-cols="{}">'
        ).format(
            html.escape(css_font_family(), quote=True),
            html.escape(json.dumps(np.round(w.astype(np.float64), 6).tolist()), quote=True),
            html.escape(json.dumps(heatmap.row_labels, ensure_ascii=False), quote=True),
            html.escape(json.dumps(heatmap.col_labels, ensure_ascii=False), quote=True),
        ),
        "<tr><th></th>"
        + "".join(f'<th class="col"><span>{html.escape(c)}</span></th>' for c in heatmap.col_labels)
        + "</tr>",
    ]
    for i, row_label in enumerate(heatmap.row_labels):
        cells = []
        for j, col_label in enumerate(heatmap.col_labels):
            value = float(w[i, j])
            classes, text = [], ""
            if "window" in marks:
                lo, hi = marks["window"][i]
                if lo - 1e-6 <= j <= hi + 1e-6:
                    classes.append("in-window")
                if j == int(round(marks["center"][i])):
                    classes.append("center")
            if one_row:
                text = f"{value:.2f}".lstrip("0") if value < 1 else "1"
            if "chosen" in marks and marks["chosen"][i] == j:
                classes.append("chosen")
                text = "●"
            shade = value / scale
            color = "#fff" if shade > 0.55 else "#111"
            cells.append(
                f'<td class="{" ".join(classes)}" style="background: rgba(29, 78, 216, {shade:.3f}); color: {color}" '
                f'title="{html.escape(row_label)} → {html.escape(col_label)}: {value:.3f}">{text}</td>'
            )
        out.append(f'<tr><th class="row">{html.escape(row_label)}</th>{"".join(cells)}</tr>')
    out.append("</table></div>")
    if "center" in marks:
        positions = ", ".join(f"{p:.2f}" for p in marks["center"])
        out.append(
            f'<div class="attn-note">aligned position p_t per step (0-based source position): {positions}; '
            f"window: outlined cells, p_t: ringed cell</div>"
        )
    if "chosen" in marks:
        out.append(
            '<div class="attn-note">hard attention: chosen position per step: '
            + ", ".join(str(j) for j in marks["chosen"])
            + "</div>"
        )
    return "\n".join(out)


CSS = """
.attn-map { border-collapse: collapse; font-size: 12px; }
.attn-map td { width: 22px; height: 22px; min-width: 22px; border: 1px solid #e5e7eb; \
text-align: center; font-size: 9px; }
.attn-map th.col { vertical-align: bottom; height: 90px; }
.attn-map th.col span { writing-mode: vertical-rl; transform: rotate(180deg); \
white-space: nowrap; font-weight: normal; }
.attn-map th.row { text-align: right; padding-right: 6px; white-space: nowrap; font-weight: normal; }
.attn-map td.in-window { border: 1px solid #f59e0b; }
.attn-map td.center { outline: 2px solid #dc2626; outline-offset: -2px; }
.attn-scroll { overflow-x: auto; max-width: 100%; }
.candidates { border-collapse: collapse; margin: 4px 0; }
.candidates td, .candidates th { border: 1px solid #d1d5db; padding: 2px 8px; text-align: left; }
.attn-title { font-weight: 600; margin: 6px 0; }
.attn-note, .attn-message { margin: 6px 0; }
"""


def render_attention(
    config,
    data: dict | None,
    view: str | None = CROSS,
    layer: str | None = None,
    head: str | None = None,
    unit: str | None = SUBWORDS,
    step: str | None = None,
) -> str:
    """The heat-map HTML for the pickers' values (strings as the app's radios give them: layer and
    head 1-based, ``MEAN_OVER_HEADS``, step 1-based or ``ALL_STEPS``), from an Explanation's
    ``to_json()`` (None before the first translation)."""
    if not has_attention(config):
        return heatmap_html(
            None,
            f"This model ({describe_attention(config)}, attention='none') has no "
            "attention to show: its decoder sees only the encoder's final state.",
        )
    if data is None:
        return heatmap_html(None, "Type a sentence and press Translate.")
    e = Explanation.from_json(data)
    head_value = MEAN_OVER_HEADS if head in (None, MEAN_OVER_HEADS) else int(head) - 1
    step_value = None if step in (None, ALL_STEPS) else int(step) - 1
    layer_value = int(layer) - 1 if layer else -1
    return heatmap_html(
        select(e, view or CROSS, layer_value, head_value, unit or SUBWORDS, step_value), f"this model has no {view}"
    )


def candidates_html(explanation: Explanation, beam: bool, seconds: float | None = None, run: int = 0) -> str:
    """The candidates as an HTML table (rank, translation, score), and how long ``explain`` took
    (``data-run`` counts the translations since the app started)."""
    what = "score = log p(y | x) / length^α" if beam else "greedy search; score = log p(y | x)"
    rows = "".join(
        f'<tr><td>{i + 1}</td><td class="candidate">{html.escape(text)}</td><td class="score">{score:.4f}</td></tr>'
        for i, (text, score) in enumerate(explanation.candidates)
    )
    timing = "" if seconds is None else f"; translated with its attention in {seconds:.2f} s"
    return (
        f'<table class="candidates"><tr><th>#</th><th>candidate</th><th>score</th></tr>{rows}</table>'
        f'<div class="attn-note" data-run="{run}">{html.escape(what)}{timing}</div>'
    )


# ---------------------------------------------------------------------------------------------
# The Gradio app


def load_model(path_or_id: str, *, trust_remote_code: bool = True, device: str | None = None):
    """Model and tokenizer through transformers alone (what the Space does): the folder's or Hub
    repo's remote code, eager attention (it returns weights), evaluation mode."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path_or_id, trust_remote_code=trust_remote_code)
    model = AutoModelForSeq2SeqLM.from_pretrained(
        path_or_id, trust_remote_code=trust_remote_code, attn_implementation="eager"
    )
    if device:
        model.to(device)
    return model.eval(), tokenizer


def _int_choices(count: int) -> list[str]:
    return [str(i + 1) for i in range(count)]


def warm_up(model, tokenizer) -> None:
    """Do before serving what the first translation would otherwise wait for: one short greedy and
    one beam translation (torch's first-call work), and matplotlib's backend resolution, which
    Gradio runs around every event and which imports pyplot the first time (measured: 1-2 s of a
    2 s first translation on a loaded 2-core host; benchmarks/bench_explorer.py)."""
    for num_beams in (1, 2):
        explain(model, tokenizer, "a b c", num_beams=num_beams, max_new_tokens=3)
    try:
        import matplotlib
    except ImportError:  # a Space without matplotlib: Gradio skips the backend switch too
        return
    matplotlib.get_backend()


def build_app(model, tokenizer, *, title: str = "Attention explorer", example: str | None = None, warm: bool = True):
    """The Gradio Blocks app for ``model`` (call ``.launch(...)`` on it; see :func:`launch`);
    ``warm`` runs :func:`warm_up` first."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    import gradio as gr

    if warm:
        warm_up(model, tokenizer)

    config = model.config
    transformer = config.model_type == "transformer_seq2seq"
    default_beams = int(getattr(model.generation_config, "num_beams", 1) or 1)
    default_lp = float(getattr(model.generation_config, "length_penalty", 1.0) or 1.0)
    decoder_heads = getattr(config, "decoder_attention_heads", 1)
    decoder_layers = getattr(config, "decoder_layers", 1)
    runs: list[float] = []  # seconds of each translation since the app started

    def layers_and_heads(view):
        if transformer:
            layers = config.encoder_layers if view == ENCODER_SELF else config.decoder_layers
            heads = config.encoder_attention_heads if view == ENCODER_SELF else config.decoder_attention_heads
        else:
            layers = heads = 1
        return layers, heads

    def render(data, view, layer, head, unit, step):
        return render_attention(config, data, view, layer, head, unit, step)

    def on_translate(source, mode, beams, length_penalty, view, layer, head, unit):
        beam = mode == "beam search"
        started = time.perf_counter()
        try:
            e = explain(
                model,
                tokenizer,
                source,
                num_beams=int(beams) if beam else 1,
                length_penalty=float(length_penalty) if beam else None,
            )
        except ValueError as err:
            raise gr.Error(str(err)) from None
        runs.append(time.perf_counter() - started)
        data = e.to_json()
        steps = [ALL_STEPS] + [f"{t + 1}" for t in range(len(e.tgt_tokens))]
        return (
            e.translation,
            candidates_html(e, beam, runs[-1], len(runs)),
            data,
            render(data, view, layer, head, unit, None),
            gr.Dropdown(choices=steps, value=ALL_STEPS),
        )

    def on_view(data, view, head, unit, step):
        layers, heads = layers_and_heads(view)
        head_choices = [MEAN_OVER_HEADS] + _int_choices(heads)
        head = head if head in head_choices else MEAN_OVER_HEADS
        layer = str(layers)
        return (
            gr.Radio(choices=_int_choices(layers), value=layer),
            gr.Radio(choices=head_choices, value=head),
            render(data, view, layer, head, unit, step),
        )

    with gr.Blocks(title=title, fill_width=True) as app:
        gr.Markdown(f"## {html.escape(title)}\n{describe_attention(config)}.")
        state = gr.State(None)
        source = gr.Textbox(label="Source sentence", value=example or "", lines=2, elem_id="source")
        with gr.Row():
            mode = gr.Radio(
                ["greedy", "beam search"],
                value="beam search" if default_beams > 1 else "greedy",
                label="Decoding",
                elem_id="mode",
            )
            beams = gr.Slider(2, 12, value=max(2, default_beams), step=1, label="Beam size", elem_id="beams")
            length_penalty = gr.Slider(
                -2.0, 3.0, value=default_lp, step=0.1, label="Length penalty α (beam search)", elem_id="length-penalty"
            )
        translate_button = gr.Button("Translate", variant="primary", elem_id="translate")
        translation = gr.Textbox(label="Translation", interactive=False, elem_id="translation")
        candidates = gr.HTML(elem_id="candidates", apply_default_css=False)
        with gr.Row():
            view = gr.Radio(
                [CROSS, ENCODER_SELF, DECODER_SELF] if transformer else [CROSS],
                value=CROSS,
                label="Attention",
                elem_id="view",
                visible=transformer,
            )
            layer = gr.Radio(
                _int_choices(decoder_layers),
                value=str(decoder_layers),
                label="Layer",
                elem_id="layer",
                visible=transformer,
            )
            head = gr.Radio(
                [MEAN_OVER_HEADS] + _int_choices(decoder_heads),
                value=MEAN_OVER_HEADS,
                label="Head",
                elem_id="head",
                visible=transformer,
            )
            unit = gr.Radio([SUBWORDS, WORDS], value=SUBWORDS, label="Tokens", elem_id="unit")
            step = gr.Dropdown([ALL_STEPS], value=ALL_STEPS, label="Decoder step (cross-attention)", elem_id="step")
        heatmap = gr.HTML(render(None, CROSS, None, None, SUBWORDS, None), elem_id="heatmap", apply_default_css=False)

        translate_inputs = [source, mode, beams, length_penalty, view, layer, head, unit]
        translate_outputs = [translation, candidates, state, heatmap, step]
        translate_button.click(on_translate, translate_inputs, translate_outputs)
        source.submit(on_translate, translate_inputs, translate_outputs)
        # ``.input`` fires on the user's pick only, not when a handler sets the value (``on_view``
        # resetting layer and head, ``on_translate`` resetting the step): each pick renders once,
        # and a late cascade render can never replace the map of a newer pick.
        view.input(on_view, [state, view, head, unit, step], [layer, head, heatmap])
        for picker in (layer, head, unit, step):
            picker.input(render, [state, view, layer, head, unit, step], heatmap)
    return app


def launch(app, *, port: int | None = None, host: str = "127.0.0.1", **kwargs):
    """Serve ``app`` on ``host:port`` with nothing leaving the machine: no analytics, no share
    tunnel (so no frpc download), system fonts only (the default theme fetches web fonts)."""
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    import gradio as gr

    theme = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["monospace"])
    return app.launch(server_name=host, server_port=port, share=False, theme=theme, css=CSS, ssr_mode=False, **kwargs)


def main(argv: list[str] | None = None) -> None:
    """``python app.py [--model PATH_OR_ID] [--port P]``: the Space's entry point."""
    import argparse

    here = os.path.dirname(os.path.abspath(__file__))
    settings = os.path.join(here, SPACE_SETTINGS)
    written = None
    if os.path.isfile(settings):
        with open(settings, encoding="utf-8") as file:
            written = json.load(file).get("model")
    parser = argparse.ArgumentParser(description="Attention explorer")
    has_model = os.path.isfile(os.path.join(here, "config.json"))
    parser.add_argument(
        "--model",
        default=os.environ.get("MODEL_ID") or (here if has_model else written),
        help=f"model folder or Hub id (default: $MODEL_ID, else this folder when it holds a "
        f"model, else the Hub id the export wrote in {SPACE_SETTINGS})",
    )
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "7860")))
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"))
    args = parser.parse_args(argv)
    if not args.model:
        parser.error("--model: no model in this folder; give a model folder or Hub id (or set MODEL_ID)")
    model, tokenizer = load_model(args.model)
    launch(
        build_app(model, tokenizer, title=f"Attention explorer: {os.path.basename(os.path.normpath(args.model))}"),
        port=args.port,
        host=args.host,
    )
