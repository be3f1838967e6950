"""The one font fallback list of every heat-map the package draws.

matplotlib's default font, DejaVu Sans, has Latin, Greek and Cyrillic but no CJK: the labels of a
Chinese, Japanese or Korean sentence come out as empty boxes with one "Glyph ... missing from
font(s) DejaVu Sans" warning per character. Since matplotlib 3.6 a list of families falls back
glyph by glyph, so DejaVu Sans stays first (Latin labels look as before) and the Noto CJK faces
(Debian's ``fonts-noto-cjk``, which ``scripts/install.sh`` installs) cover the rest.

Used by the training plots, ``plot-attention`` and the model card's heat-map (all drawn by
``attention/plotting.py``, which calls :func:`configure_matplotlib` on import) and by the attention
explorer (``explorer.py``), whose HTML heat-maps name the same families in CSS. This module
imports only the standard library, so the explorer's Space copy can ship it as it is.
"""

from __future__ import annotations

# Latin first, then one face per CJK region (the TTC collection's families; matplotlib reads the
# first face of a .ttc file, so whichever of them the system exposes serves all CJK ideographs),
# then other CJK fonts a system may have instead.
FONT_FALLBACK: tuple[str, ...] = (
    "DejaVu Sans",
    "Noto Sans CJK JP",
    "Noto Sans CJK SC",
    "Noto Sans CJK TC",
    "Noto Sans CJK KR",
    "Noto Sans CJK HK",
    "Noto Sans SC",
    "Source Han Sans SC",
    "WenQuanYi Zen Hei",
    "Droid Sans Fallback",
)


def css_font_family() -> str:
    """``FONT_FALLBACK`` as a CSS ``font-family`` value, ending with the generic ``sans-serif``."""
    return ", ".join(f'"{name}"' for name in FONT_FALLBACK) + ", sans-serif"


def installed_fallback_fonts() -> list[str]:
    """The families of ``FONT_FALLBACK`` that matplotlib finds on this system, in list order,
    one per font file (the Noto CJK collection holds every region's face in one file).

    matplotlib caches its font list; a font installed after the cache was written (a CJK font
    added by ``scripts/install.sh`` to a machine that had drawn plots before) is added from the
    system's font folders here.
    """
    from matplotlib import font_manager

    def files_by_name() -> dict[str, str]:
        return {entry.name: entry.fname for entry in font_manager.fontManager.ttflist}

    found = files_by_name()
    if not any(name in found for name in FONT_FALLBACK[1:]):
        for path in font_manager.findSystemFonts():
            if "CJK" in path or "WenQuanYi" in path or "DroidSansFallback" in path:
                try:
                    font_manager.fontManager.addfont(path)
                except (OSError, RuntimeError, ValueError):
                    continue  # an unreadable font file: skip it
        found = files_by_name()
    chosen, files = [], set()
    for name in FONT_FALLBACK:
        if name in found and found[name] not in files:
            chosen.append(name)
            files.add(found[name])
    return chosen


def configure_matplotlib() -> list[str]:
    """Make matplotlib's sans-serif family the installed part of ``FONT_FALLBACK``; returns it.

    Only installed families are listed, because matplotlib warns once per missing family name.
    Without any CJK font installed, the list is just DejaVu Sans (the default) and CJK labels
    still warn; ``scripts/install.sh`` installs ``fonts-noto-cjk``.
    """
    import matplotlib

    installed = installed_fallback_fonts()
    if installed:
        # The families themselves, not the generic "sans-serif": matplotlib resolves a generic
        # name to one font, and falls back glyph by glyph only across the listed families.
        matplotlib.rcParams["font.family"] = installed
    return installed
