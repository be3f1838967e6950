"""The attention explorer: translate one sentence and look at its attention in the browser.

A Gradio app (``attention-seq2seq demo -m MODEL``, or ``app.py`` of an export written with
``--space``) with a source box, the decoding settings (greedy, or beam search with its size and
length penalty) and Translate. It shows the translation, the beam's candidates with their scores,
and the attention as heat-maps over source and target subwords or words:

- the cross-attention: for the Transformer per decoder layer and head, or the mean over heads;
  for the RNN its one alignment matrix (Bahdanau et al. 2015, figure 3), also one step at a time;
  for Luong's local attention (Luong et al. 2015, §3.2) the aligned position p_t of each step and
  the window [p_t - D, p_t + D]; for hard attention the position each step chose;
- the Transformer's encoder and decoder self-attention, with the same layer and head pickers.

Everything is computed once per Translate by :func:`explain` (the package's teacher-forced
attention pass, ``attention/sentences.py``: ``generate``, then one forward pass with
``output_attentions=True`` over the chosen translation, which gives the weights decoding used:
cache and no cache agree, tests/test_*_seq2seq.py); the pickers only redraw. Each heat-map is
an HTML table whose ``data-weights`` attribute holds the plotted array, so a test
(tests/test_explorer_browser.py) can read what the page shows.

Shipping: this file imports only the standard library, numpy, torch, transformers and gradio
(gradio only inside :func:`build_app`), its font list from ``fonts.py`` and the attention pass
from ``attention/sentences.py`` (which imports only torch, transformers and
``modeling/attention_pass.py`` with its ``generation_lengths.py``), so ``--space`` copies these
files into the export and the app runs where only the Hub packages are installed, loading the
model through its shipped remote code.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch

try:
    from .fonts import css_font_family
except ImportError:  # the Space copy: app.py run as a script, fonts.py copied beside it
    from attention_fonts import css_font_family  # type: ignore[no-redef]
try:
    from .sentences import attention_pass
except ImportError:  # the Space copy: attention/sentences.py copied beside it (hub/space.py)
    from attention_sentences import attention_pass  # type: ignore[no-redef]

MEAN_OVER_HEADS = "mean over heads"
CROSS, ENCODER_SELF, DECODER_SELF = "cross-attention", "encoder self-attention", "decoder self-attention"
SUBWORDS, WORDS = "subwords", "words"
ALL_STEPS = "all steps"
WORD_MARKERS = ("▁", "Ġ")  # SentencePiece's and byte-level BPE's word-start markers


# ---------------------------------------------------------------------------------------------
# What one translation's attention looks like


@dataclass
class Explanation:
    """One source sentence, its translation and every attention array of that translation.

    Row ``t`` of ``cross`` is the attention while predicting ``tgt_tokens[t]``; the decoder read
    ``decoder_tokens[t]`` (the start token, then ``tgt_tokens[:-1]``) at that step.
    """

    source: str
    translation: str
    candidates: list[tuple[str, float]]  # (text, score); beam: generate's sequences_scores
    src_tokens: list[str]
    tgt_tokens: list[str]
    decoder_tokens: list[str]
    cross: np.ndarray | None  # (num_layers, num_heads, tgt_len, src_len); None without attention
    encoder_self: np.ndarray | None = None  # (encoder_layers, num_heads, src_len, src_len)
    decoder_self: np.ndarray | None = None  # (decoder_layers, num_heads, tgt_len, tgt_len)
    aligned_positions: np.ndarray | None = None  # local windows: p_t per step, (tgt_len,)
    window_size: int | None = None  # D of the window [p_t - D, p_t + D]
    hard: bool = False  # hard attention: each row is one-hot on the chosen position
    special_tokens: set[str] = field(default_factory=set)

    def to_json(self) -> dict:
        """Plain lists and numbers (what gr.State and the page keep)."""
        out = dict(self.__dict__)
        for name in ("cross", "encoder_self", "decoder_self", "aligned_positions"):
            if out[name] is not None:
                out[name] = out[name].tolist()
        out["special_tokens"] = sorted(self.special_tokens)
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Explanation":
        data = dict(data)
        for name in ("cross", "encoder_self", "decoder_self", "aligned_positions"):
            if data.get(name) is not None:
                data[name] = np.asarray(data[name], dtype=np.float32)
        data["special_tokens"] = set(data.get("special_tokens", ()))
        data["candidates"] = [tuple(c) for c in data["candidates"]]
        return cls(**data)


def describe_attention(config) -> str:
    """One line naming the model's attention, e.g. "Luong (general), local-p, D = 10, hard"."""
    if config.model_type == "transformer_seq2seq":
        return (
            f"Transformer: {config.encoder_layers} encoder and {config.decoder_layers} decoder layers, "
            f"{config.decoder_attention_heads} heads of scaled dot-product attention"
        )
    attention = getattr(config, "attention", "none")
    if attention == "none":
        return "RNN encoder-decoder without attention"
    parts = [f"RNN with {attention.capitalize()} attention" + (f" ({config.score})" if config.score else "")]
    if config.window and config.window != "global":
        parts.append(f"{config.window} window, D = {config.window_size}")
    if config.attention_mode == "hard":
        parts.append("hard (one position per step)")
    if config.coverage:
        parts.append("coverage")
    return ", ".join(parts)


def has_attention(config) -> bool:
    return config.model_type == "transformer_seq2seq" or getattr(config, "attention", "none") != "none"


def _window_module(model):
    """The RNN decoder's attention module when it uses a local window, else None (duck-typed: a
    model loaded as remote code has its own classes)."""
    for module in model.modules():
        # `window_kind` today; `window` (the same string) in exports written before the redesign
        kind = getattr(module, "window_kind", None) or getattr(module, "window", None)
        if isinstance(kind, str) and kind in ("local-m", "local-p") and hasattr(module, "aligned_position"):
            return module
    return None


@torch.inference_mode()
def explain(
    model,
    tokenizer,
    source: str,
    *,
    num_beams: int = 1,
    length_penalty: float | None = None,
    max_new_tokens: int | None = None,
    target: str | None = None,
) -> Explanation:
    """Translate ``source`` with ``generate`` and collect the attention of the chosen translation
    (or of ``target``, teacher-forced, when given).

    Args:
        model: an encoder-decoder of this package (installed or remote code); a Transformer in
            SDPA (which returns no weights) is switched to eager attention for the call only.
        tokenizer: its tokenizer.
        source: one sentence.
        num_beams: 1 for greedy search, else beam search with this beam size.
        length_penalty: beam search's α (score = log p / length^α); ignored for greedy search.
        max_new_tokens: longest translation (default: the model's generation_config).
        target: a translation to teacher-force instead of decoding (no ``generate`` call).

    Returns:
        an :class:`Explanation`. Beam candidates are generate's ``num_beams`` finished hypotheses
        with ``sequences_scores``; greedy's one candidate scores log p(y | x) (summed).

    Raises:
        ValueError: ``source`` is empty, or ``num_beams`` < 1.
    """
    if not source.strip():
        raise ValueError("the source sentence is empty; type a sentence to translate")
    if num_beams < 1:
        raise ValueError(f"num_beams must be >= 1; got {num_beams}")
    kwargs: dict = {"num_beams": num_beams, "do_sample": False}
    if num_beams > 1:
        kwargs.update(num_return_sequences=num_beams, output_scores=True)
        if length_penalty is not None:
            kwargs["length_penalty"] = float(length_penalty)
    if max_new_tokens is not None:
        kwargs["max_new_tokens"] = max_new_tokens

    window = _window_module(model)
    centers: list[torch.Tensor] = []

    @contextlib.contextmanager
    def record_centers():
        """Record local attention's p_t during the teacher-forced forward (not during generate)."""
        if window is None:
            yield
            return

        # p_t is computed inside the attention's forward; recompute it from the same inputs:
        # (query, keys, values, attention_mask, positions[, coverage]).
        def record(module, args, output):
            query, attention_mask, positions = args[0], args[3], args[4]
            centers.append(module.aligned_position(query, positions, attention_mask.sum(-1)).float())

        hook = window.register_forward_hook(record)
        try:
            yield
        finally:
            hook.remove()

    forced = attention_pass(
        model,
        tokenizer,
        [source],
        None if target is None else [target],
        generate_kwargs={**kwargs, "return_dict_in_generate": True},
        self_attention=True,
        forward_context=record_centers(),
    )
    sentence, generated = forced.sentences[0], forced.generated
    if generated is not None:
        texts = [t.strip() for t in tokenizer.batch_decode(generated.sequences, skip_special_tokens=True)]
    else:
        texts = [target]

    def stack(layers):
        if not layers:
            return None
        return torch.stack(list(layers)).float().cpu().numpy()  # (layers, heads, q, k)

    cross = stack(sentence.cross) if has_attention(model.config) else None
    if generated is not None and num_beams > 1:
        candidates = [(text, float(score)) for text, score in zip(texts, generated.sequences_scores.tolist())]
    else:
        labels = torch.tensor(sentence.target_ids, device=sentence.logits.device)
        log_probs = torch.log_softmax(sentence.logits.float(), dim=-1)
        candidates = [(texts[0], float(log_probs.gather(-1, labels.unsqueeze(-1)).sum()))]
    return Explanation(
        source=source,
        translation=texts[0],
        candidates=candidates,
        src_tokens=sentence.source_tokens,
        tgt_tokens=sentence.target_tokens,
        decoder_tokens=sentence.decoder_tokens,
        cross=cross,
        encoder_self=stack(sentence.encoder_self),
        decoder_self=stack(sentence.decoder_self),
        aligned_positions=torch.cat(centers, dim=1)[0].cpu().numpy() if centers else None,
        window_size=getattr(model.config, "window_size", None) if window is not None else None,
        hard=getattr(model.config, "attention_mode", None) == "hard",
        special_tokens=set(tokenizer.all_special_tokens),
    )


# ---------------------------------------------------------------------------------------------
# Words from subwords


def word_groups(tokens: list[str], special_tokens: set[str] = frozenset()) -> list[tuple[str, list[int]]]:
    """Group subword tokens into words: ``[(word, [token indices])]``.

    A token opens a new word when it carries a word-start marker (SentencePiece's ``▁``, byte-level
    BPE's ``Ġ``), is a special token, or follows a special token; the others continue the word.
    """
    groups: list[tuple[str, list[int]]] = []
    previous_special = True
    for i, token in enumerate(tokens):
        special = token in special_tokens
        if special or previous_special or token.startswith(WORD_MARKERS) or not groups:
            groups.append(("", []))
        text, indices = groups[-1]
        piece = token if special else token.lstrip("".join(WORD_MARKERS))
        groups[-1] = (text + piece, indices + [i])
        previous_special = special
    return [(text or tokens[indices[0]], indices) for text, indices in groups]


def to_words(weights: np.ndarray, row_groups, col_groups) -> np.ndarray:
    """Word-level attention from subword attention (rows, cols) -> (row words, col words).

    A source word receives the sum of its subwords' weights (rows stay distributions); a target
    word's row is the mean of its subwords' rows.
    """
    summed = np.stack([weights[:, idx].sum(axis=1) for _, idx in col_groups], axis=1)
    return np.stack([summed[idx].mean(axis=0) for _, idx in row_groups], axis=0)


# ---------------------------------------------------------------------------------------------
# Picking and drawing one heat-map


@dataclass
class HeatMap:
    """One drawn map: weights (rows, cols) with their labels, title, marks and shading scale."""

    weights: np.ndarray  # (rows, cols)
    row_labels: list[str]
    col_labels: list[str]
    title: str
    marks: dict = field(default_factory=dict)  # {"window": [(lo, hi)], "center": [p_t], "chosen": [j]}
    scale: float | None = None  # the weight drawn darkest (default: the largest shown)


def select(
    explanation: Explanation,
    view: str = CROSS,
    layer: int = -1,
    head: int | str = MEAN_OVER_HEADS,
    unit: str = SUBWORDS,
    step: int | None = None,
) -> HeatMap | None:
    """The heat-map the pickers ask for, or None when that view has no weights.

    Args:
        view: CROSS, ENCODER_SELF or DECODER_SELF.
        layer: 0-based layer (-1: the last).
        head: 0-based head, or MEAN_OVER_HEADS.
        unit: SUBWORDS, or WORDS (see :func:`to_words`).
        step: only this 0-based target step's row (cross-attention), or None for all steps.
    """
    e = explanation
    array = {CROSS: e.cross, ENCODER_SELF: e.encoder_self, DECODER_SELF: e.decoder_self}[view]
    if array is None:
        return None
    num_layers, num_heads = array.shape[:2]
    layer = layer % num_layers
    per_layer = array[layer]
    weights = per_layer.mean(axis=0) if head == MEAN_OVER_HEADS else per_layer[int(head)]
    rows, cols = {
        CROSS: (e.tgt_tokens, e.src_tokens),
        ENCODER_SELF: (e.src_tokens, e.src_tokens),
        DECODER_SELF: (e.decoder_tokens, e.decoder_tokens),
    }[view]
    head_text = "mean over heads" if head == MEAN_OVER_HEADS else f"head {int(head) + 1}"
    title = f"{view}, layer {layer + 1} of {num_layers}, {head_text}" if num_heads > 1 or num_layers > 1 else view
    marks: dict = {}
    if view == CROSS and e.aligned_positions is not None:
        d = e.window_size
        marks["center"] = [float(p) for p in e.aligned_positions]
        marks["window"] = [(float(p) - d, float(p) + d) for p in e.aligned_positions]
    if view == CROSS and e.hard:
        marks["chosen"] = [int(j) for j in weights.argmax(axis=1)]
    row = step  # the row of ``step`` in the map drawn
    if unit == WORDS:
        row_groups = word_groups(list(rows), e.special_tokens)
        col_groups = word_groups(list(cols), e.special_tokens)
        weights = to_words(weights, row_groups, col_groups)
        rows, cols = [w for w, _ in row_groups], [w for w, _ in col_groups]
        marks = {}  # positions are subword positions; shown in the subword view only
        title += ", words"
        if step is not None:  # the target word that step's subword belongs to
            row = next(k for k, (_, indices) in enumerate(row_groups) if step in indices)
    scale = float(weights.max())  # one step is shaded as in the whole map, not stretched to its own max
    if step is not None and view == CROSS:
        weights = weights[row : row + 1]
        rows = [rows[row]]
        marks = {name: values[row : row + 1] for name, values in marks.items()}
        title += f", step {step + 1}"
    return HeatMap(np.asarray(weights, dtype=np.float32), list(rows), list(cols), title, marks, scale)


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
    parser = argparse.ArgumentParser(description="Attention explorer")
    has_model = os.path.isfile(os.path.join(here, "config.json"))
    parser.add_argument(
        "--model",
        default=os.environ.get("MODEL_ID") or (here if has_model else DEFAULT_MODEL),
        help="model folder or Hub id (default: $MODEL_ID, else this folder when it holds a "
        "model, else the Hub id the export wrote)",
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


DEFAULT_MODEL = None  # the Space copy sets the Hub id of its model (export --space --repo-id)

if __name__ == "__main__":
    main()
