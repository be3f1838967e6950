"""Model cards for exported models: Hub metadata from metrics.json, a body from ``hub_cards/``.

The metadata block is built with huggingface_hub's ``ModelCardData`` and ``EvalResult`` (so the
Hub reads the ``model-index``: BLEU and chrF per test set, with the sacreBLEU signature as the
metric's config). The body is the template ``hub_cards/model_card.md`` with its ``{{ name }}``
slots filled from the model config, metrics.json and recipe.yaml. The family files
(``rnn_seq2seq.md``, ``transformer_seq2seq.md``), ``corpora.md`` and ``usage.md`` hold named
sections, each starting at a ``<!-- section: name -->`` line; the renderer picks the sections that
describe this model. Rendering is deterministic: no dates, no machine-dependent values.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from importlib import resources

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..data.presets import DEFAULT_CARD_LICENSE, preset_of_record
from ..translation.scores import format_score
from ..modeling.registry import BY_MODEL_TYPE

_SLOT = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_SECTION = re.compile(r"^<!-- section: ([\w-]+) -->\n", re.MULTILINE)

# The corpora's Hub datasets, card licences (the data's terms bind the model trained on it),
# sections and limitation notes: data/presets.py. The families' card templates: modeling/registry.py.

EXAMPLES = {
    "de": "Ein Mann fährt mit dem Fahrrad durch die Stadt.",
    "en": "A man rides a bicycle through the city.",
    "es": "En el principio creó Dios los cielos y la tierra.",
    "fr": "Un homme traverse la ville à vélo.",
    "zh": "我们明天去公园吧。",
}


class ModelCardError(ValueError):
    """A card cannot be rendered: a template slot without a value, or metrics not in the documented schema."""


# ---------------------------------------------------------------------------- templates


def _template(name: str) -> str:
    return resources.files("attention_seq2seq.hub_cards").joinpath(name).read_text(encoding="utf-8")


def template_sections(name: str) -> dict[str, str]:
    """The named sections of a template file. A setting without a section of its own yet gets a
    plain sentence instead (``sections.get(name, sentence)``): a new option value must not make
    the export fail."""
    parts = _SECTION.split(_template(name))
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts), 2)}


CITATIONS = template_sections("citations.md")  # key -> BibTeX entry


def fill(template: str, values: dict[str, object], where: str) -> str:
    """Replace every ``{{ name }}`` slot of ``template`` with ``str(values[name])``.

    Raises:
        ModelCardError: a slot has no value (naming the slot and ``where`` it is).
    """

    def substitute(match: re.Match) -> str:
        key = match.group(1)
        if key not in values:
            raise ModelCardError(f"{where}: no value for the slot {{{{ {key} }}}}")
        return str(values[key])

    return _SLOT.sub(substitute, template)


# ---------------------------------------------------------------------------- corpus


def dataset_id_of(corpus: dict | None) -> str | None:
    """The card's dataset identifier: a Hub dataset id when the corpus is on the Hub (``hf:<id>``
    specs, Multi30k), else a slug of the corpus name; never a local path."""
    if not corpus:
        return None
    spec = str(corpus.get("spec") or "")
    if spec.startswith("hf:"):
        return spec[3:].split(":")[0]
    preset = preset_of_record(corpus)
    if preset is not None and preset.hub_dataset:
        return preset.hub_dataset
    name = corpus.get("name") or spec.split(":")[0]
    slug = re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")
    return slug or None


def public_spec(spec: str | None) -> str:
    """A corpus spec without the local folders it names: ``tsv:/home/me/data/train.tsv`` → ``tsv:train.tsv``
    (``hf:<id>`` specs stay whole)."""
    if not spec:
        return "?"
    scheme, sep, rest = str(spec).partition(":")
    if scheme == "hf":  # a Hub dataset id, not a path
        return str(spec)
    parts = [re.split(r"[/\\]", part.rstrip("/\\"))[-1] for part in rest.split(",")]
    return f"{scheme}{sep}{','.join(parts)}"


def _languages(corpus: dict | None) -> list[str] | None:
    if not corpus:
        return None
    languages = [corpus.get("source_lang"), corpus.get("target_lang")]
    return [lang for lang in languages if lang] or None


# ---------------------------------------------------------------------------- metadata


def build_card_data(
    metrics: dict | None,
    model_name: str,
    family_tags: list[str],
    base_model: str | None = None,
    license: str | None = None,
) -> ModelCardData:
    """The card's YAML metadata: languages, license, tags, datasets, metrics and the model-index.

    The model-index holds one result per test set of ``metrics["test"]``, with the BLEU and chrF
    values (and TER where metrics.json has it: runs from before TER have none) exactly as in
    metrics.json and each sacreBLEU signature as its metric's ``config``.

    Raises:
        ModelCardError: a test entry lacks ``bleu`` or ``chrf``.
    """
    corpus = (metrics or {}).get("corpus") or {}
    preset = preset_of_record(corpus)
    dataset_id = dataset_id_of(corpus)
    license_fields = {"license": license} if license else dict(preset.card_license if preset else DEFAULT_CARD_LICENSE)

    eval_results = []
    for test_name, result in ((metrics or {}).get("test") or {}).items():
        for metric, pretty in (("bleu", "BLEU"), ("chrf", "chrF"), ("ter", "TER")):
            if metric == "ter" and metric not in result:
                continue  # optional: scored since TER joined the metrics
            if metric not in result:
                raise ModelCardError(f"metrics.json: test set {test_name!r} has no {metric!r} score")
            eval_results.append(
                EvalResult(
                    task_type="translation",
                    task_name="Translation",
                    dataset_type=dataset_id or test_name,
                    dataset_name=test_name,
                    dataset_split=result.get("split"),
                    metric_type=metric,
                    metric_name=pretty,
                    metric_value=result[metric],
                    metric_config=result.get(f"{metric}_signature"),
                )
            )
    return ModelCardData(
        language=_languages(corpus),
        library_name="transformers",
        pipeline_tag="translation",
        tags=["translation", "seq2seq", "attention_seq2seq", *family_tags, "custom_code"],
        datasets=[dataset_id] if dataset_id else None,
        metrics=["bleu", "chrf"] + (["ter"] if any(r.metric_type == "ter" for r in eval_results) else []),
        base_model=base_model,
        model_name=model_name if eval_results else None,  # the model-index's name; nothing else uses it
        eval_results=eval_results or None,
        **license_fields,
    )


# ---------------------------------------------------------------------------- body sections


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return str(value)


def _rnn_architecture(config, num_parameters: int, lm_class: str) -> tuple[str, list[str], list[str], str]:
    """Markdown, tags, citation keys and the limitation line of an RNN model, from its config."""
    sections = template_sections("rnn_seq2seq.md")
    cell = config.cell_type.upper()
    directions = "bidirectional" if config.bidirectional else "unidirectional"
    attention = config.attention
    if attention == "none":
        attention_name = "no attention"
        attention_setting = "none"
    elif attention == "bahdanau":
        attention_name = "Bahdanau (additive) attention"
        attention_setting = "Bahdanau, additive score"
    else:
        attention_name = f"Luong attention ({config.score} score, {config.window} window)"
        attention_setting = f"Luong, score `{config.score}`, window `{config.window}`"
    if attention != "none":
        attention_setting += f", {config.attention_mode} weights"
        if attention == "luong":
            attention_setting += ", input feeding" if config.input_feeding else ", no input feeding"
        if config.coverage:
            attention_setting += ", coverage"
    values = {
        "attention_name": attention_name,
        "lm_class": lm_class,
        "num_parameters": f"{num_parameters:,}",
        "encoder": f"{config.encoder_layers} × {directions} {cell}, {config.encoder_hidden_size} units per direction",
        "decoder": f"{config.decoder_layers} × {cell}, {config.hidden_size} units",
        "embeddings": f"{config.embedding_size} dimensions, vocabulary {config.vocab_size}"
        + (", shared by encoder and decoder" if config.share_embeddings else ""),
        "bridge": {"zero": "zeros", "last": "the encoder's final state", "projection": "tanh(W [h→_S; h←_1])"}[
            config.bridge
        ],
        "attention_setting": attention_setting,
        "output_layer": "tied to the decoder embeddings" if config.tie_word_embeddings else "separate weights",
        "window_size": config.window_size,
        "window_width": 2 * (config.window_size or 0) + 1,
        "coverage_loss_weight": _fmt(config.coverage_loss_weight),
    }
    parts = [sections["overview"]]
    tags = ["rnn", cell.lower()]
    citations = ["bahdanau2015"]
    if attention == "none":
        parts.append(sections["none"])
        citations = ["sutskever2014", "bahdanau2015"]
    elif attention == "bahdanau":
        parts.append(sections["bahdanau"])
        tags.append("bahdanau-attention")
    else:
        parts += [sections["luong"], sections.get(f"score-{config.score}", f"Score function: `{config.score}`.")]
        if config.window not in (None, "global"):
            parts.append(sections.get(config.window, f"Attention window: `{config.window}`."))
        if config.input_feeding:
            parts.append(sections["input-feeding"])
        tags.append("luong-attention")
        citations.append("luong2015")
    if attention != "none" and config.attention_mode == "hard":
        parts.append(sections["hard"])
        tags.append("hard-attention")
    if config.coverage:
        parts.append(sections["coverage"])
        tags.append("coverage")
        citations += ["tu2016", "see2017"]
    text = fill("\n\n".join(parts), values, "hub_cards/rnn_seq2seq.md")
    limitation = (
        "- An RNN encoder-decoder degrades on long sentences (Bahdanau et al., 2015, figure 2); "
        "attention reduces but does not remove this."
    )
    return text, tags, citations, limitation


def _transformer_architecture(config, num_parameters: int, lm_class: str) -> tuple[str, list[str], list[str], str]:
    """Markdown, tags, citation keys and the limitation line of a Transformer model, from its config."""
    sections = template_sections("transformer_seq2seq.md")
    embeddings = "shared by encoder and decoder" if config.share_encoder_decoder_embeddings else "separate per side"
    if config.tie_word_embeddings:
        embeddings += ", tied to the output projection"
    activation = {"relu": r"\max(0, x W_1 + b_1)\, W_2 + b_2", "gelu": r"\mathrm{GELU}(x W_1 + b_1)\, W_2 + b_2"}
    values = {
        "lm_class": lm_class,
        "num_parameters": f"{num_parameters:,}",
        "encoder_layers": config.encoder_layers,
        "decoder_layers": config.decoder_layers,
        "d_model": config.d_model,
        "encoder_attention_heads": config.encoder_attention_heads,
        "decoder_attention_heads": config.decoder_attention_heads,
        "encoder_ffn_dim": config.encoder_ffn_dim,
        "decoder_ffn_dim": config.decoder_ffn_dim,
        "activation_function": config.activation_function,
        "positions": config.position_embedding_type,
        "max_position_embeddings": config.max_position_embeddings,
        "norm_order": f"{config.norm_order}-norm",
        "embeddings": embeddings,
        "dropout": _fmt(config.dropout),
        "attention_dropout": _fmt(config.attention_dropout),
        "activation_dropout": _fmt(config.activation_dropout),
        "vocab_size": config.vocab_size,
        "head_dim": config.d_model // config.encoder_attention_heads,
        "ffn_equation": activation[config.activation_function],
        "scaled": " √d_model-scaled" if config.scale_embedding else "",
    }
    parts = [
        sections["overview"],
        sections.get(config.position_embedding_type, f"Position embeddings: `{config.position_embedding_type}`."),
        sections.get(config.norm_order, f"Layer normalisation order: `{config.norm_order}`."),
    ]
    citations = ["vaswani2017"]
    if config.norm_type == "scale_norm":
        parts.append(sections["scale_norm"])
        citations.append("nguyen2019")
    if config.fix_norm:
        parts.append(sections["fix_norm"])
        citations.append("nguyen2018")
    text = fill("\n\n".join(parts), values, "hub_cards/transformer_seq2seq.md")
    limitation = (
        f"- Inputs and outputs are limited to {config.max_position_embeddings} tokens "
        "(the model raises an error beyond that)."
    )
    return text, ["transformer"], citations, limitation


# The body builder of each family's card template (modeling/registry.py names the template).
_ARCHITECTURES = {"rnn_seq2seq.md": _rnn_architecture, "transformer_seq2seq.md": _transformer_architecture}


def _training_data(metrics: dict | None) -> tuple[str, list[str]]:
    corpus = (metrics or {}).get("corpus")
    if not corpus:
        return "Not recorded: this export was made without a metrics.json.", []
    preset = preset_of_record(corpus)
    sections = template_sections("corpora.md")
    languages = " → ".join(_languages(corpus) or ["?"])
    spec = public_spec(corpus.get("spec"))
    header = f"Language pair: {languages}. Corpus specification: `{spec}`."
    name = corpus.get("name")
    body = fill(
        sections.get(preset.kind if preset else "other", sections["other"]),
        {
            "spec": spec,
            "name_part": f" ({name})" if name else "",
            "license": corpus.get("license") or "not recorded",
        },
        "hub_cards/corpora.md",
    )
    lines = [header, body]
    if corpus.get("attribution") and preset is None:
        lines.append(f"Attribution: {corpus['attribution']}")
    return "\n\n".join(lines), list(preset.citations if preset else ())


def _flatten(mapping: dict, prefix: str = "") -> list[tuple[str, object]]:
    rows = []
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            rows.extend(_flatten(value, f"{name}."))
        else:
            rows.append((name, value))
    return rows


def _training_procedure(metrics: dict | None, recipe: dict | None, generation_config) -> str:
    parts = []
    train = (metrics or {}).get("train")
    if train:
        facts = [
            ("optimizer steps", train.get("steps")),
            ("epochs", train.get("epochs")),
            ("wall time (s)", train.get("wall_time_s")),
            ("target tokens / s", train.get("target_tokens_per_s")),
            ("final training loss", train.get("final_train_loss")),
        ]
        rows = [f"| {name} | {_fmt(value)} |" for name, value in facts if value is not None]
        parts.append("| training run | |\n|---|---|\n" + "\n".join(rows))
    if recipe:
        rows = [
            f"| `{name}` | `{_fmt(value)}` |"
            for name, value in _flatten(recipe)
            if not name.rsplit(".", 1)[-1].startswith("debug_")  # the trainer's test hooks, not hyperparameters
        ]
        parts.append(
            "Hyperparameters (the run's fully resolved recipe, `recipe.yaml` in this repository):"
            "\n\n| hyperparameter | value |\n|---|---|\n" + "\n".join(rows)
        )
    else:
        parts.append("The training hyperparameters were not recorded with this export.")
    decoding = {key: getattr(generation_config, key, None) for key in ("num_beams", "max_new_tokens", "length_penalty")}
    rows = [f"| `{key}` | {_fmt(value)} |" for key, value in decoding.items() if value is not None]
    parts.append("Default decoding (`generation_config.json`):\n\n| option | value |\n|---|---|\n" + "\n".join(rows))
    return "\n\n".join(parts)


def test_scores(metrics: dict | None) -> list[str]:
    """One Markdown list line per test set of metrics.json: BLEU, chrF where recorded, beams."""
    rows = []
    for name, entry in ((metrics or {}).get("test") or {}).items():
        if isinstance(entry, dict) and "bleu" in entry:
            chrf = f", chrF {entry['chrf']:.1f}" if isinstance(entry.get("chrf"), (int, float)) else ""
            beams = f" (beam {entry['num_beams']})" if entry.get("num_beams") else ""
            rows.append(f"- {name}: BLEU {entry['bleu']:.1f}{chrf}{beams}")
    return rows


def _evaluation(metrics: dict | None) -> str:
    tests = (metrics or {}).get("test") or {}
    if not tests:
        return "No test-set evaluation was recorded with this export."
    # TER where metrics.json has it (runs from before TER joined the scores have none).
    with_ter = any("ter" in result for result in tests.values())
    metric_names = ("bleu", "chrf", "ter") if with_ter else ("bleu", "chrf")
    rows, signatures = [], []
    for name, result in tests.items():
        cells = [format_score(result, m) if m in result else "" for m in metric_names]
        rows.append(
            f"| {name} | {result.get('split', '')} | {_fmt(result.get('num_sentences', ''))} | "
            f"{_fmt(result.get('num_beams', ''))} | " + " | ".join(cells) + " |"
        )
        for metric in metric_names:
            if result.get(f"{metric}_signature"):
                signatures.append(f"- {name}, {metric}: `{result[f'{metric}_signature']}`")
    bootstrapped = any(f"{metric}_ci95" in result for result in tests.values() for metric in metric_names)
    header = "| test set | split | sentences | beams | BLEU | chrF |" + (" TER (lower is better) |" if with_ter else "")
    table = (
        "Scores with sacreBLEU on detokenized output against the raw references"
        + (" (± the half-width of the 95% bootstrap confidence interval)" if bootstrapped else "")
        + ":\n\n"
        + header
        + "\n"
        + "|---" * (4 + len(metric_names))
        + "|\n"
        + "\n".join(rows)
    )
    if signatures:
        table += "\n\nsacreBLEU signatures:\n\n" + "\n".join(signatures)
    return table


def _limitations(family_limitation: str, metrics: dict | None) -> str:
    preset = preset_of_record((metrics or {}).get("corpus"))
    lines = [
        "- The model knows only its training corpus: expect poor output on other domains, styles and "
        "on words its subword vocabulary splits into many pieces.",
        "- It translates one sentence at a time; there is no document context.",
    ]
    lines.append(family_limitation)
    lines.append("- Attention weights are an alignment aid, not a faithful explanation of the model's decisions.")
    if preset is not None and preset.limitation:
        lines.append(preset.limitation)
    return "\n".join(lines)


def _usage(config, generation_config, metrics: dict | None, repo_id: str) -> str:
    languages = _languages((metrics or {}).get("corpus")) or ["en"]
    values = {
        "repo_id": repo_id,
        "example": EXAMPLES.get(languages[0], EXAMPLES["en"]),
        "num_beams": getattr(generation_config, "num_beams", None) or 1,
        "max_new_tokens": getattr(generation_config, "max_new_tokens", None) or 128,
    }
    return fill(template_sections("usage.md")["usage"], values, "hub_cards/usage.md")


def code_checksums(folder: Path, repo_id: str) -> str:
    """The card's "Code checksums" section: the SHA-256 of every ``.py`` file under ``folder`` (the
    code ``trust_remote_code=True`` runs), so a user can check a download against the card."""
    import hashlib

    rows = [
        f"| `{path.relative_to(folder).as_posix()}` | `{hashlib.sha256(path.read_bytes()).hexdigest()}` |"
        for path in sorted(folder.rglob("*.py"))
    ]
    return (
        "## Code checksums\n\n"
        "The SHA-256 of every Python file in this repository, as exported. To check a download, run "
        "`sha256sum $(find . -name '*.py' | sort)` in the folder of "
        f'`huggingface_hub.snapshot_download("{repo_id}", revision=REVISION)` and compare.\n\n'
        "| file | SHA-256 |\n|---|---|\n" + "\n".join(rows)
    )


# ---------------------------------------------------------------------------- card


def render_model_card(
    config,
    generation_config,
    metrics: dict | None,
    recipe: dict | None,
    repo_id: str,
    heatmap: str | None = None,
    base_model: str | None = None,
    license: str | None = None,
    num_parameters: int = 0,
) -> str:
    """The full README.md (YAML metadata + markdown body) of an exported model.

    Args:
        config: the model config (``rnn_seq2seq`` or ``transformer_seq2seq``).
        generation_config: the model's default ``GenerationConfig``.
        metrics: metrics.json's content (docs/DESIGN.md schema) or None.
        recipe: recipe.yaml's content or None.
        repo_id: the Hub id the usage snippets load.
        heatmap: file name of the attention heat-map next to the card, or None.
        base_model: Hub id of the model this one was fine-tuned from.
        license: license id overriding the one chosen from the training corpus.
        num_parameters: the model's parameter count, shown in the description.

    Raises:
        ModelCardError: unknown model type, a template slot without a value, a test result without
            BLEU or chrF.
    """
    family = BY_MODEL_TYPE.get(config.model_type)
    if family is None or family.card_template not in _ARCHITECTURES:
        expected = " or ".join(repr(t) for t, f in BY_MODEL_TYPE.items() if f.card_template in _ARCHITECTURES)
        raise ModelCardError(f"no card template for model_type {config.model_type!r}; expected {expected}")
    architecture, family_tags, citation_keys, family_limitation = _ARCHITECTURES[family.card_template](
        config, num_parameters, family.lm_class
    )
    model_name = repo_id.split("/")[-1]
    card_data = build_card_data(metrics, model_name, family_tags, base_model=base_model, license=license)
    training_data, data_citations = _training_data(metrics)
    corpus = (metrics or {}).get("corpus") or {}
    pair = " → ".join(_languages(corpus) or [])
    summary = (
        f"A {pair + ' ' if pair else ''}translation model trained with `attention_seq2seq`"
        + (f" on {corpus.get('name') or corpus.get('spec')}" if corpus else "")
        + (f", fine-tuned from [{base_model}](https://huggingface.co/{base_model})" if base_model else "")
        + "."
    )
    figure = (
        f"![Cross-attention of a test sentence]({heatmap})\n\n"
        "Cross-attention weights of the model on a test sentence (target tokens down, source tokens across)."
        if heatmap
        else ""
    )
    citations = "\n\n".join(CITATIONS[key] for key in dict.fromkeys(citation_keys + data_citations))
    body = fill(
        _template("model_card.md"),
        {
            "title": model_name,
            "summary": summary,
            "architecture": architecture,
            "training_data": training_data,
            "training_procedure": _training_procedure(metrics, recipe, generation_config),
            "evaluation": _evaluation(metrics),
            "attention_figure": figure,
            "usage": _usage(config, generation_config, metrics, repo_id),
            "limitations": _limitations(family_limitation, metrics),
            "citations": f"```bibtex\n{citations}\n```",
        },
        "hub_cards/model_card.md",
    )
    body = re.sub(r"\n{3,}", "\n\n", body).strip() + "\n"
    card = ModelCard(f"---\n{card_data.to_yaml()}\n---\n\n{body}")
    return str(card)
