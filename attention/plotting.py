"""Attention heat-maps (matplotlib, Agg backend: no display needed).

- RNN models have one cross-attention distribution per target step: the alignment matrix of
  Bahdanau et al. (2015, figure 3), drawn as one heat-map, target tokens down, source across.
- Transformer models have one per layer and head. ``<name>.png`` shows each layer's head
  average side by side; ``<name>_layer<L>_heads.png`` shows every head of layer L.

All functions take weights as arrays of shape ``(num_heads, tgt_len, src_len)`` per layer
(the model's ``cross_attentions`` for one sentence, padding already cut off).

Labels use the package's one font fallback list (attention/fonts.py): DejaVu Sans, then
Noto CJK, so Chinese, Japanese and Korean tokens render instead of "Glyph ... missing" boxes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: training runs on servers
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .fonts import configure_matplotlib  # noqa: E402

configure_matplotlib()  # training plots, plot-attention and the card's heat-map all draw here


def _draw(
    ax, weights: np.ndarray, src_tokens: Sequence[str], tgt_tokens: Sequence[str], title: str, labels: bool = True
):
    ax.imshow(
        weights, cmap="Greys", vmin=0.0, vmax=max(1e-9, float(weights.max())), aspect="auto", interpolation="nearest"
    )
    ax.set_title(title, fontsize=8)
    if labels:
        ax.set_xticks(range(len(src_tokens)))
        ax.set_xticklabels(src_tokens, rotation=90, fontsize=6)
        ax.set_yticks(range(len(tgt_tokens)))
        ax.set_yticklabels(tgt_tokens, fontsize=6)
    else:
        ax.set_xticks([])
        ax.set_yticks([])


def _check(weights: np.ndarray, src_tokens: Sequence[str], tgt_tokens: Sequence[str]) -> None:
    if weights.ndim != 3:
        raise ValueError(f"attention weights must be (num_heads, tgt_len, src_len); got shape {weights.shape}")
    if weights.shape[1:] != (len(tgt_tokens), len(src_tokens)):
        raise ValueError(
            f"attention of shape {weights.shape[1:]} does not match {len(tgt_tokens)} target x "
            f"{len(src_tokens)} source tokens"
        )


def plot_cross_attentions(
    cross_attentions: Sequence[np.ndarray],
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    out_dir: str | Path,
    name: str,
    per_head: bool = True,
) -> list[Path]:
    """Write heat-maps of one sentence's cross-attention; returns the files written.

    Args:
        cross_attentions: per decoder layer, weights of shape (num_heads, tgt_len, src_len).
        src_tokens: the ``src_len`` source token strings (x axis).
        tgt_tokens: the ``tgt_len`` target token strings (y axis).
        out_dir: folder for the PNG files (created).
        name: file stem; the main figure is ``<out_dir>/<name>.png``.
        per_head: also write one figure per layer with every head (only if num_heads > 1).

    Raises:
        ValueError: weights of the wrong rank, or not matching the token lists.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    layers = [np.asarray(w, dtype=np.float32) for w in cross_attentions]
    if not layers:
        raise ValueError("no attention layers to plot")
    for w in layers:
        _check(w, src_tokens, tgt_tokens)

    # Main figure: the head average of each layer (for an RNN: its single alignment matrix).
    num_layers = len(layers)
    cell = 0.25
    width = max(3.0, cell * len(src_tokens) + 1.5)
    height = max(2.5, cell * len(tgt_tokens) + 1.5)
    fig, axes = plt.subplots(1, num_layers, figsize=(width * num_layers, height), squeeze=False)
    for i, w in enumerate(layers):
        title = "alignment" if num_layers == 1 and w.shape[0] == 1 else f"layer {i + 1}, head average"
        _draw(axes[0, i], w.mean(axis=0), src_tokens, tgt_tokens, title)
    fig.tight_layout()
    main = out_dir / f"{name}.png"
    fig.savefig(main, dpi=100)
    plt.close(fig)
    written = [main]

    if per_head:
        for i, w in enumerate(layers):
            num_heads = w.shape[0]
            if num_heads == 1:
                continue
            cols = min(4, num_heads)
            rows = math.ceil(num_heads / cols)
            fig, axes = plt.subplots(rows, cols, figsize=(width * cols * 0.8, height * rows * 0.8), squeeze=False)
            for h in range(rows * cols):
                ax = axes[h // cols, h % cols]
                if h < num_heads:
                    _draw(ax, w[h], src_tokens, tgt_tokens, f"layer {i + 1}, head {h + 1}", labels=(h % cols == 0))
                else:
                    ax.axis("off")
            fig.tight_layout()
            path = out_dir / f"{name}_layer{i + 1}_heads.png"
            fig.savefig(path, dpi=80)
            plt.close(fig)
            written.append(path)
    return written
