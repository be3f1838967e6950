"""The named corpora this package knows, in one table: how they are read, what they are called,
their terms, and what the model card says about them.

The loaders (``corpora.py``, ``bible.py``) read :data:`PRESETS` for the languages, file format,
name, licence and attribution of a preset kind (``multi30k:<dir>``, ``tatoeba:<dir>``,
``bible``); the trainer records the preset in ``metrics.json`` (``corpus.preset``); the model card
(``hub/model_card.py``) takes its corpus section, Hub licence, dataset id and limitation note from
the same entry. A new named corpus is one :class:`CorpusPreset` here (plus its section in
``hub_cards/corpora.md``). Nothing here imports more than the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_CARD_LICENSE = {"license": "apache-2.0"}  # corpora that are no preset: the package's own licence

TATOEBA_ATTRIBUTION = (
    "Attribution: www.manythings.org/anki and tatoeba.org. Sentence pairs from the Tatoeba Project "
    "(https://tatoeba.org), licensed under CC-BY 2.0 FR (https://creativecommons.org/licenses/by/2.0/fr/)."
)
MULTI30K_ATTRIBUTION = (
    "Elliott, D., Frank, S., Sima'an, K. and Specia, L. (2016). Multi30K: Multilingual "
    "English-German Image Descriptions. Proceedings of the 5th Workshop on Vision and Language, pp. 70-74."
)


@dataclass(frozen=True)
class CorpusPreset:
    """One named corpus.

    Attributes:
        kind: the spec kind that names it (``multi30k:<dir>``).
        format: the generic reader of its files (``"text"``, ``"tsv"``; ``"bible"`` has its own).
        default_pair: ``(source, target)`` languages when the spec gives none, or None (required).
        columns: for a ``tsv`` preset, the column of each language its files hold; the spec's
            pair must be two of them (and picks the columns). None: the format's defaults.
        name: display name, formatted with ``src`` and ``tgt`` (``"Multi30k {src}-{tgt}"``); None:
            the loader names it (the Bible's name comes from its modules).
        license: the terms recorded in ``metrics.json``; None: the loader finds them.
        attribution: the attribution recorded in ``metrics.json``; None: the loader finds it.
        card_license: the model card's licence metadata (the data's terms bind the model).
        hub_dataset: its Hub dataset id, where it exists there with the same splits.
        citations: keys of the model card's ``CITATIONS`` to cite for the data.
        limitation: the card's line under "Limitations", or None.
        legacy_names: lower-case words besides ``kind`` by which a ``metrics.json`` written before
            ``corpus.preset`` was recorded names this corpus in its spec or name (read by the card
            only for such files).

    The model card describes it with the section of ``hub_cards/corpora.md`` named ``kind``.
    """

    kind: str
    format: str
    default_pair: tuple[str, str] | None
    name: str | None
    license: str | None
    attribution: str | None
    columns: dict[str, int] | None = None
    card_license: dict = field(default_factory=lambda: dict(DEFAULT_CARD_LICENSE))
    hub_dataset: str | None = None
    citations: tuple[str, ...] = ()
    limitation: str | None = None
    legacy_names: tuple[str, ...] = ()


PRESETS: dict[str, CorpusPreset] = {
    preset.kind: preset
    for preset in (
        CorpusPreset(
            kind="bible",
            format="bible",
            default_pair=("es", "en"),
            name=None,  # "Bible <source abbreviation>-<target abbreviation>", from the SWORD modules
            license=None,  # from the modules' DistributionLicense
            attribution=None,  # from the modules' descriptions and copyright lines
            limitation="- Bible translations use archaic, religious language unlike everyday text.",
        ),
        CorpusPreset(
            kind="multi30k",
            format="text",
            default_pair=("de", "en"),
            name="Multi30k {src}-{tgt}",
            license="non-commercial research (Flickr30K terms)",
            attribution=MULTI30K_ATTRIBUTION,
            card_license={
                "license": "other",
                "license_name": "multi30k-non-commercial-research",
                "license_link": "https://github.com/multi30k/dataset#use-of-the-data",
            },
            hub_dataset="bentrevett/multi30k",
            citations=("multi30k",),
            limitation="- Multi30k is short image descriptions; its terms restrict use to non-commercial research.",
        ),
        CorpusPreset(
            kind="tatoeba",
            format="tsv",
            columns={"zh": 0, "en": 1},  # manythings' cmn-eng, split into train/dev/test.tsv
            default_pair=("zh", "en"),
            name="Tatoeba {src}-{tgt} (manythings.org)",
            license="CC-BY 2.0 FR",
            attribution=TATOEBA_ATTRIBUTION,
            card_license={"license": "cc-by-2.0"},
            limitation="- Tatoeba sentences are short and conversational; the data contains some errors.",
            legacy_names=("manythings", "cmn"),
        ),
    )
}


def preset_of_record(corpus: dict | None) -> CorpusPreset | None:
    """The preset of a ``metrics.json`` ``corpus`` record: its ``preset`` entry, or, for a record
    written before that entry existed, the spec's kind, else the first preset whose
    kind or ``legacy_names`` occur in the spec or name (the order of :data:`PRESETS`). None: no preset."""
    if not corpus:
        return None
    if "preset" in corpus:
        return PRESETS.get(corpus["preset"]) if corpus["preset"] else None
    kind = str(corpus.get("spec") or "").split(":")[0].lower()
    if kind in PRESETS:
        return PRESETS[kind]
    text = f"{corpus.get('spec', '')} {corpus.get('name', '')}".lower()
    for preset in PRESETS.values():
        if any(word in text for word in (preset.kind, *preset.legacy_names)):
            return preset
    return None
