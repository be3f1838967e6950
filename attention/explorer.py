"""What the attention explorer shows: one sentence's translation and every attention array of it.

:func:`explain` translates a sentence (greedy or beam search) and collects, through the
package's teacher-forced attention pass (``attention/sentences.py``: ``generate``, then one
forward pass with ``output_attentions=True`` over the chosen translation, which gives the weights
decoding used: cache and no cache agree, tests/test_*_seq2seq.py):

- the cross-attention: for the Transformer per decoder layer and head; for the RNN its one
  alignment matrix (Bahdanau et al. 2015, figure 3); for Luong's local attention (Luong et al.
  2015, §3.2) the aligned position p_t of each step and the window [p_t - D, p_t + D]; for hard
  attention the position each step chose;
- the Transformer's encoder and decoder self-attention.

:func:`select` picks one heat-map of it (a layer and head or the mean over heads, subwords or
words, all steps or one). The Gradio app around them is ``attention_seq2seq/explorer_app.py``.

Shipped in the explorer's Space (hub/space.py): imports only numpy, torch, transformers and the
attention pass (which imports only torch, transformers and ``modeling/attention_pass.py`` with its
``generation_lengths.py``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch

from .sentences import attention_pass

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
