"""One font fallback list for every heat-map (attention/fonts.py): Chinese labels render.

matplotlib's DejaVu Sans has no CJK glyphs; before the fallback list, each Chinese character of a
heat-map label printed "Glyph ... missing from font(s) DejaVu Sans" and drew an empty box. The
font comes from Debian's fonts-noto-cjk (scripts/install.sh)."""

from __future__ import annotations

import logging
import warnings

import numpy as np

from helpers import tatoeba_dir

from attention_seq2seq.attention.fonts import FONT_FALLBACK, css_font_family, installed_fallback_fonts
from attention_seq2seq.attention.plotting import plot_cross_attentions


def _zh_en_pair() -> tuple[list[str], list[str]]:
    """The first test pair of the Tatoeba zh-en slice, as characters and words."""
    line = (tatoeba_dir() / "test.tsv").read_text(encoding="utf-8").splitlines()[0].split("\t")
    english, chinese = (line[0], line[1]) if line[1] and ord(line[1][0]) > 0x2E80 else (line[1], line[0])
    return list(chinese) + ["</s>"], english.split() + ["</s>"]


def test_a_zh_en_heatmap_renders_without_missing_glyphs(tmp_path, caplog):
    installed = installed_fallback_fonts()
    assert len(installed) >= 2, (
        f"no CJK font of {FONT_FALLBACK[1:]} is installed; install Debian's fonts-noto-cjk (scripts/install.sh)"
    )
    src, tgt = _zh_en_pair()
    assert any(ord(ch) > 0x2E80 for ch in "".join(src)), src
    weights = np.random.default_rng(0).random((2, len(tgt), len(src)))
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, logger="matplotlib"):
        warnings.simplefilter("always")
        written = plot_cross_attentions([weights / weights.sum(-1, keepdims=True)], src, tgt, tmp_path, "zh-en")
    messages = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "missing from font" in m or "findfont" in m], messages[:3]
    assert all(path.stat().st_size > 0 for path in written)


def test_plots_and_the_explorer_use_the_one_list():
    import matplotlib

    installed = installed_fallback_fonts()
    assert list(matplotlib.rcParams["font.family"]) == installed  # set when attention/plotting.py loads
    assert installed[0] == "DejaVu Sans"  # Latin labels look as before
    assert css_font_family().startswith('"DejaVu Sans", "Noto Sans CJK JP"')
