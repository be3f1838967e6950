"""Export a Transformer as a native transformers class: no shipped code, no ``trust_remote_code``.

Our Transformer computes the same maths as three classes transformers already has, once the
weights are renamed and, for sinusoidal positions, the features of the residual stream reordered:

=====================================  ============================================  ==========================
our configuration                      native class                                  what differs
=====================================  ============================================  ==========================
post-norm, sinusoidal positions        ``MarianMTModel``                             sin/cos feature order
pre-norm (final LayerNorm), sinusoidal ``PegasusForConditionalGeneration``           sin/cos feature order
pre-norm, learned positions            ``BlenderbotForConditionalGeneration``        nothing but key names
=====================================  ============================================  ==========================

Sinusoidal positions: we interleave the features exactly as Vaswani et al. 2017, §3.5 writes them
(PE(pos, 2i) = sin, PE(pos, 2i+1) = cos); Marian and Pegasus build their table with all sines
first, then all cosines, and rebuild it on load (the table is not read from the weights). The two
tables hold the same numbers in another feature order, so the export permutes the d_model
features of the whole residual stream the same way: columns of the token embeddings, of every
projection that reads the stream (q/k/v, cross-attention k/v, fc1, lm_head), rows of every
projection that writes to it (out_proj, fc2), and the LayerNorm gains and shifts (a LayerNorm
commutes with a permutation of its features). The heads' inner features are untouched. The
result computes the same function up to float32 rounding (~1e-6 on the logits).

FixNorm (unit-length embedding rows, Nguyen & Chiang 2018) is folded exactly: the exported
embedding and output matrices are the unit-length rows our forward computes.

Refused, with one line naming the setting and pointing to ``--format remote``: the RNN family,
post-norm with learned positions (Marian rebuilds a sinusoidal table on load; BART, the learned
post-norm class, adds a LayerNorm on the embeddings and offsets positions by 2), ScaleNorm, a
``layer_norm_eps`` other than 1e-5 (the native classes' fixed ``nn.LayerNorm`` epsilon), and
separate encoder/decoder embeddings for Pegasus and Blenderbot (which always share them).

The export checks itself before writing: the native model's logits on a padded batch must be
within ``CHECK_TOLERANCE`` of ours.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..common.durability import write_atomically
from .export import (
    ExportError,
    _check_destination,
    _read_config_json,
    _read_mapping,
    _reset_tokenizer_runtime_state,
    resolve_sources,
)
from .model_card import EXAMPLES, fill, template_sections, test_scores

# The epsilon of every nn.LayerNorm in Marian, Pegasus and Blenderbot (not a config field there).
NATIVE_LAYER_NORM_EPS = 1e-5
# Largest |logit difference| the export accepts between our model and the native one.
CHECK_TOLERANCE = 1e-4
REMOTE_HINT = "use --format remote (the default export, loaded with trust_remote_code=True)"


@dataclass(frozen=True)
class NativeLayout:
    """Which transformers class reproduces a configuration."""

    name: str  # "marian" | "pegasus" | "blenderbot"
    model_class: str
    sinusoidal: bool  # positions rebuilt by the native class: features must be reordered
    description: str

    @property
    def config_class(self) -> str:
        return f"{self.name.capitalize()}Config"  # MarianConfig, PegasusConfig, BlenderbotConfig


_PRE_NORM = "pre-norm with a final LayerNorm per stack"
LAYOUTS = {
    layout.name: layout
    for layout in (
        NativeLayout("marian", "MarianMTModel", True, "post-norm, sinusoidal positions"),
        NativeLayout("pegasus", "PegasusForConditionalGeneration", True, f"{_PRE_NORM}, sinusoidal positions"),
        NativeLayout("blenderbot", "BlenderbotForConditionalGeneration", False, f"{_PRE_NORM}, learned positions"),
    )
}


class NativeExportRefused(ExportError):
    """The model has no lossless native transformers equivalent; the message names the setting."""


def refuse_unless_layer_norm_transformer(config: dict, refused: type[ExportError], target: str) -> None:
    """Raise ``refused`` (one line naming the setting, pointing to ``--format remote``) unless a
    saved ``config.json`` is this package's Transformer with LayerNorm: ``target`` (native
    transformers, CTranslate2) has no RNN and no ScaleNorm."""
    model_type = config.get("model_type")
    if model_type == "rnn_seq2seq":
        raise refused(f"model_type 'rnn_seq2seq' (the RNN family) has no {target} equivalent; {REMOTE_HINT}")
    if model_type != "transformer_seq2seq":
        raise refused(f"model_type {model_type!r} is not this package's Transformer; {REMOTE_HINT}")
    if config.get("norm_type", "layer_norm") != "layer_norm":
        raise refused(f"norm_type={config['norm_type']!r} (ScaleNorm) has no {target} equivalent; {REMOTE_HINT}")


def native_layout(config: dict) -> NativeLayout:
    """The native class that computes what a saved ``config.json`` (as a dict) describes.

    Raises:
        NativeExportRefused: one line naming the first setting without a lossless native
            equivalent, and pointing to ``--format remote``.
    """
    refuse_unless_layer_norm_transformer(config, NativeExportRefused, "native transformers")
    eps = config.get("layer_norm_eps", 1e-5)
    if not math.isclose(eps, NATIVE_LAYER_NORM_EPS, rel_tol=0.0, abs_tol=0.0):
        raise NativeExportRefused(
            f"layer_norm_eps={eps} differs from the native classes' fixed LayerNorm epsilon "
            f"{NATIVE_LAYER_NORM_EPS}; {REMOTE_HINT}"
        )
    pre = config.get("norm_order", "post") == "pre"
    learned = config.get("position_embedding_type", "sinusoidal") == "learned"
    if learned and not pre:
        raise NativeExportRefused(
            "norm_order='post' with position_embedding_type='learned' has no lossless native class (Marian "
            f"rebuilds sinusoidal positions on load; BART adds an embedding LayerNorm and offsets positions by 2); "
            f"{REMOTE_HINT}"
        )
    layout = LAYOUTS["blenderbot" if learned else ("pegasus" if pre else "marian")]
    if layout.name != "marian" and not config.get("share_encoder_decoder_embeddings", True):
        raise NativeExportRefused(
            f"share_encoder_decoder_embeddings=False: {layout.model_class} always shares the encoder and decoder "
            f"embeddings; {REMOTE_HINT}"
        )
    return layout


# ---------------------------------------------------------------------------- weights


def sin_first_permutation(d_model: int) -> torch.Tensor:
    """Indices ``perm`` with ``native[..., k] = ours[..., perm[k]]``: our interleaved sinusoid features
    (sin at even, cos at odd indices; Vaswani et al. 2017, §3.5) reordered to all sines, then all
    cosines (Marian's and Pegasus's tables). Shape (d_model,)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


# Which dimension of each weight runs over the residual stream's d_model features, by key suffix.
_STREAM_COLUMNS = (
    "embed_tokens.weight", "shared.weight", "lm_head.weight", "embed_positions.weight",
    "q_proj.weight", "k_proj.weight", "v_proj.weight", "fc1.weight",
)  # fmt: skip
_STREAM_ROWS = ("out_proj.weight", "out_proj.bias", "fc2.weight", "fc2.bias", "layer_norm.weight", "layer_norm.bias")
_STREAM_FREE = ("q_proj.bias", "k_proj.bias", "v_proj.bias", "fc1.bias")
_EMBEDDING_KEYS = ("embed_tokens.weight", "shared.weight", "lm_head.weight")


def native_state_dict(model, layout: NativeLayout) -> dict[str, torch.Tensor]:
    """Our Transformer's weights under the native class's names, features reordered for
    sinusoidal layouts and FixNorm folded into the embedding rows.

    Key renames: ``*.feed_forward.fc1`` → ``*.fc1`` (and fc2); everything else already has
    Marian/BART's names.

    Raises:
        ExportError: a weight this mapping does not know (a model newer than this exporter).
    """
    from ..modeling.modeling_transformer_seq2seq import unit_rows

    config = model.config
    perm = sin_first_permutation(config.d_model) if layout.sinusoidal else None
    state = {}
    for key, tensor in model.state_dict().items():
        tensor = tensor.detach().clone()
        if config.fix_norm and key.endswith(_EMBEDDING_KEYS):
            tensor = unit_rows(tensor)  # what our forward computes from it, input side and lm_head
        if perm is not None:
            if key.endswith(_STREAM_COLUMNS):
                tensor = tensor[:, perm]
            elif key.endswith(_STREAM_ROWS):
                tensor = tensor[perm]
            elif not key.endswith(_STREAM_FREE):
                raise ExportError(f"native export: no feature mapping for weight {key!r}")
        state[key.replace(".feed_forward.", ".")] = tensor.contiguous()
    return state


# The configuration fields our Transformer and the native classes share, name and meaning.
_SAME_FIELDS = (
    "vocab_size d_model encoder_layers decoder_layers encoder_attention_heads decoder_attention_heads "
    "encoder_ffn_dim decoder_ffn_dim activation_function dropout attention_dropout activation_dropout "
    "max_position_embeddings scale_embedding pad_token_id bos_token_id eos_token_id decoder_start_token_id "
    "tie_word_embeddings"
).split()


def native_config(config, layout: NativeLayout):
    """The native class's config for our ``TransformerSeq2SeqConfig``: every field that changes the
    computation or the token ids set explicitly (the native defaults differ: Marian and Pegasus do
    not scale embeddings by default, Blenderbot forces ``</s>`` and blocks repeated source n-grams)."""
    import transformers

    fields = {name: getattr(config, name) for name in _SAME_FIELDS}
    fields.update(
        init_std=config.init_std if config.init_std is not None else config.d_model**-0.5,
        forced_eos_token_id=None,
        use_cache=True,
    )
    if layout.name == "marian":
        fields.update(
            decoder_vocab_size=config.vocab_size,
            share_encoder_decoder_embeddings=config.share_encoder_decoder_embeddings,
        )
    if layout.name == "blenderbot":
        fields.update(encoder_no_repeat_ngram_size=0)
    return getattr(transformers, layout.config_class)(**fields)


def native_generation_config(model):
    """Our generation settings for the native class, with the default length capped as our
    ``generate`` caps it (the decoder reads at most ``max_position_embeddings`` positions; the
    native classes would index past their table instead)."""
    from transformers import GenerationConfig

    ours = model.generation_config.to_dict()
    for key in ("transformers_version", "_from_model_config", "_caller_set_length"):
        ours.pop(key, None)
    generation = GenerationConfig(**ours)
    generation.forced_eos_token_id = None
    limit = model.config.max_position_embeddings
    if generation.max_new_tokens is not None and generation.max_new_tokens > limit - 1:
        generation.max_new_tokens = limit - 1
    if generation.max_length is not None and generation.max_length > limit:
        generation.max_length = limit
    return generation


def build_native_model(model):
    """A native transformers model computing what ``model`` (our Transformer, in eval mode) computes.

    Returns:
        (native model in eval mode, its ``NativeLayout``).

    Raises:
        NativeExportRefused: no lossless native class for this configuration.
        ExportError: the weights do not fit the native class (a bug, named by key).
    """
    import transformers

    layout = native_layout(model.config.to_dict())
    config = native_config(model.config, layout)
    native = getattr(transformers, layout.model_class)(config)
    state = native_state_dict(model, layout)
    missing, unexpected = native.load_state_dict(state, strict=False)
    allowed_missing = {"final_logits_bias"} | (
        {"model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"} if layout.sinusoidal else set()
    )
    if unexpected or set(missing) - allowed_missing:
        raise ExportError(
            f"native export to {layout.model_class}: weights do not fit "
            f"(missing {sorted(set(missing) - allowed_missing)}, "
            f"unexpected {sorted(unexpected)})"
        )
    with torch.no_grad():
        native.final_logits_bias.zero_()
    native.generation_config = native_generation_config(model)
    return native.eval(), layout


def max_logit_difference(model, native, vocab_size: int, seed: int = 0) -> float:
    """max |logits_ours − logits_native| on a fixed padded batch of 3 random sources (up to 12
    tokens) and 7 teacher-forced decoder positions."""
    generator = torch.Generator().manual_seed(seed)
    limit = min(12, model.config.max_position_embeddings)
    input_ids = torch.randint(4, vocab_size, (3, limit), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, limit // 2 :] = 0
    attention_mask[2, limit - 2 :] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, model.config.pad_token_id)
    decoder_input_ids = torch.randint(4, vocab_size, (3, min(7, limit)), generator=generator)
    decoder_input_ids[:, 0] = model.config.decoder_start_token_id
    with torch.no_grad():
        ours = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        theirs = native(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    return (ours.float() - theirs.float()).abs().max().item()


# ---------------------------------------------------------------------------- export


def load_our_transformer(model_dir: Path):
    """Our Transformer and its tokenizer from a saved folder, after checking the layout from
    ``config.json`` alone (so a refused model is refused before anything loads).

    Raises:
        NativeExportRefused, ExportError.
    """
    native_layout(_read_config_json(model_dir))
    from transformers import AutoTokenizer

    from ..modeling.modeling_transformer_seq2seq import TransformerSeq2SeqForConditionalGeneration

    model = TransformerSeq2SeqForConditionalGeneration.from_pretrained(model_dir).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise ExportError(
            f"cannot load a tokenizer from {model_dir} ({error}); save the tokenizer next to the model"
        ) from None
    _reset_tokenizer_runtime_state(tokenizer)
    return model, tokenizer


def export_native(
    src: str | os.PathLike,
    export_dir: str | os.PathLike,
    *,
    repo_id: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``export_dir``: the native class's ``config.json`` (no ``auto_map``), ``model.safetensors``,
    ``generation_config.json``, the tokenizer and a ``README.md`` card; no ``.py`` files.

    Args:
        src: a training output folder or a ``save_pretrained`` folder of our Transformer with its
            tokenizer.
        export_dir: the folder to write (must not exist or be empty unless ``overwrite``).
        repo_id: the Hub repository the card's snippet names (default ``<your-username>/<folder>``).
        overwrite: replace a non-empty ``export_dir`` once the new export is complete.

    Raises:
        NativeExportRefused: one line naming the setting with no lossless native equivalent.
        ExportError: bad source or destination, or the native model's logits differ from ours by
            more than ``CHECK_TOLERANCE``.
    """
    src, export_dir = Path(src), Path(export_dir)
    sources = resolve_sources(src)
    _check_destination(export_dir, src, overwrite)
    model, tokenizer = load_our_transformer(sources.model_dir)
    native, layout = build_native_model(model)
    difference = max_logit_difference(model, native, model.config.vocab_size)
    if not difference <= CHECK_TOLERANCE:
        raise ExportError(
            f"native export to {layout.model_class}: logits differ from ours by {difference:.3g} "
            f"(> {CHECK_TOLERANCE}); {REMOTE_HINT}"
        )
    metrics = _read_mapping(sources.metrics, "metrics")
    card = render_native_card(
        model.config, layout, repo_id or f"<your-username>/{export_dir.name}", metrics, difference
    )

    def write(staging: Path) -> None:
        staging.mkdir()
        native.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "README.md").write_text(card, encoding="utf-8")
        if sources.metrics is not None:
            (staging / "metrics.json").write_text(
                json.dumps(metrics, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
            )

    write_atomically(export_dir, write)
    return export_dir


def render_native_card(config, layout: NativeLayout, repo_id: str, metrics: dict | None, difference: float) -> str:
    """The README.md of a native export: which class, how to load it, how to translate."""
    from huggingface_hub import ModelCardData

    corpus = (metrics or {}).get("corpus") or {}
    languages = [lang for lang in (corpus.get("source_lang"), corpus.get("target_lang")) if lang]
    tags = ["translation", layout.name, "attention_seq2seq"]
    data = ModelCardData(language=languages or None, library_name="transformers", pipeline_tag="translation", tags=tags)
    scores = test_scores(metrics)
    values = {
        "title": repo_id.split("/")[-1],
        "model_class": layout.model_class,
        "description": layout.description,
        "encoder_layers": config.encoder_layers,
        "decoder_layers": config.decoder_layers,
        "d_model": config.d_model,
        "heads": config.encoder_attention_heads,
        "ffn_dim": config.encoder_ffn_dim,
        "activation": config.activation_function,
        "vocab_size": config.vocab_size,
        "difference": f"{difference:.1e}",
        "scores": "\nTest scores of the trained model (sacreBLEU):\n\n" + "\n".join(scores) + "\n" if scores else "",
        "repo_id": repo_id,
        "example": EXAMPLES.get(corpus.get("source_lang"), EXAMPLES["de"]),
    }
    body = fill(template_sections("native.md")["native"], values, "hub_cards/native.md")
    return f"---\n{data.to_yaml()}\n---\n{body}\n"
