"""Export a Transformer as a CTranslate2 model folder (``pip install attention-seq2seq[ct2]``).

CTranslate2 (https://github.com/OpenNMT/CTranslate2) runs Transformer encoder-decoders from a
"spec": a tree of named weight arrays and flags it saves as ``model.bin`` + ``config.json`` +
vocabulary files. Its own converters start from a native transformers model; the Marian one
starts decoding from a zero embedding instead of a start token (what Marian does, not what we
do), so this module fills a ``TransformerSpec`` straight from our weights instead, in the way
CTranslate2's BART-family converter fills it from BART:

- attention: Q, K, V of self-attention as one fused (3·d_model, d_model) matrix, cross-attention
  as Q and a fused K/V, then ``out_proj`` (CTranslate2's layout);
- ``fc1``/``fc2`` as the feed-forward's two linears; LayerNorm gain/shift as gamma/beta, with our
  ``layer_norm_eps`` in the model config;
- the position table is given explicitly (our interleaved sinusoids, or the learned table), so
  no feature reordering is needed and post-norm + learned positions converts too;
- token embeddings scaled by √d_model when ``scale_embedding``; FixNorm folded into the
  embedding rows (as in ``export_native``);
- decoding starts from our ``<s>`` (``decoder_start_token``), sources are tokenized by our
  tokenizer, ``</s>`` included (no ``add_source_eos``).

The folder also holds the tokenizer and the model's ``generation_config.json`` (decoding
defaults), so ``attention-seq2seq translate -m FOLDER`` translates with it.

Refused, with one line pointing to ``--format remote``: the RNN family and ScaleNorm (CTranslate2
has no such layers).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..common.durability import write_atomically
from ..translation.ct2_folder import MARKER_FILE
from .export import (
    ExportError,
    _check_destination,
    _read_config_json,
    _reset_tokenizer_runtime_state,
    resolve_sources,
)
from .export_native import refuse_unless_layer_norm_transformer

QUANTIZATIONS = ("int8", "int16", "float32", "bfloat16")


class CT2ExportRefused(ExportError):
    """The model cannot be converted to CTranslate2 exactly; the message names the setting."""


def check_ct2_convertible(config: dict) -> None:
    """Refuse (one line) a saved ``config.json`` CTranslate2 cannot run exactly.

    Raises:
        CT2ExportRefused: the RNN family, another model type, or ScaleNorm.
    """
    refuse_unless_layer_norm_transformer(config, CT2ExportRefused, "CTranslate2")


def _import_ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise ExportError("--format ct2 needs the ctranslate2 package: pip install 'attention-seq2seq[ct2]'") from None
    return ctranslate2


def _array(tensor: torch.Tensor):
    return tensor.detach().to(torch.float32).contiguous().numpy()


def _set_linear(spec, linear: torch.nn.Linear) -> None:
    spec.weight = _array(linear.weight)
    if linear.bias is not None:
        spec.bias = _array(linear.bias)


def _set_fused(spec, linears) -> None:
    spec.weight = _array(torch.cat([linear.weight for linear in linears]))
    spec.bias = _array(torch.cat([linear.bias for linear in linears]))


def _set_norm(spec, norm: torch.nn.LayerNorm) -> None:
    spec.gamma = _array(norm.weight)
    spec.beta = _array(norm.bias)


def _set_attention(spec, attention, cross: bool) -> None:
    if cross:
        _set_fused(spec.linear[0], [attention.q_proj])
        _set_fused(spec.linear[1], [attention.k_proj, attention.v_proj])
    else:
        _set_fused(spec.linear[0], [attention.q_proj, attention.k_proj, attention.v_proj])
    _set_linear(spec.linear[-1], attention.out_proj)


def _embedding_rows(model, embedding: torch.nn.Embedding) -> torch.Tensor:
    from ..modeling.modeling_transformer_seq2seq import unit_rows

    return unit_rows(embedding.weight) if model.config.fix_norm else embedding.weight


def _set_stack(spec, stack, model, embed_scale: float) -> None:
    """Embeddings, positions, final norm and the parts every layer shares, of one stack."""
    spec.scale_embeddings = embed_scale
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _array(_embedding_rows(model, stack.embed_tokens))
    spec.position_encodings.encodings = _array(stack.embed_positions.weight)
    if stack.layer_norm is not None:
        _set_norm(spec.layer_norm, stack.layer_norm)


def transformer_spec(model, ctranslate2):
    """A CTranslate2 ``TransformerSpec`` holding our Transformer's weights (vocabularies not yet
    registered)."""
    from ctranslate2.specs import common_spec, transformer_spec as ct2_transformer

    config = model.config
    pre_norm = config.norm_order == "pre"
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}[config.activation_function]
    encoder_spec = ct2_transformer.TransformerEncoderSpec(
        config.encoder_layers, config.encoder_attention_heads, pre_norm=pre_norm, activation=activation
    )
    decoder_spec = ct2_transformer.TransformerDecoderSpec(
        config.decoder_layers, config.decoder_attention_heads, pre_norm=pre_norm, activation=activation
    )
    spec = ct2_transformer.TransformerSpec(encoder_spec, decoder_spec)
    embed_scale = model.model.encoder.embed_tokens.embed_scale
    encoder, decoder = model.model.encoder, model.model.decoder

    for stack_spec, stack in ((spec.encoder, encoder), (spec.decoder, decoder)):
        _set_stack(stack_spec, stack, model, embed_scale)
        for layer_spec, layer in zip(stack_spec.layer, stack.layers):
            _set_attention(layer_spec.self_attention, layer.self_attn, cross=False)
            _set_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
            if stack is decoder:
                _set_attention(layer_spec.attention, layer.encoder_attn, cross=True)
                _set_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
            _set_linear(layer_spec.ffn.linear_0, layer.feed_forward.fc1)
            _set_linear(layer_spec.ffn.linear_1, layer.feed_forward.fc2)
            _set_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)
    spec.decoder.projection.weight = _array(_embedding_rows(model, model.lm_head))
    return spec


def vocabulary(tokenizer, vocab_size: int) -> list[str]:
    """The token strings in id order, ``vocab_size`` of them (made-up names fill ids the tokenizer
    does not have, as the model's embedding table may be larger).

    Raises:
        ExportError: the tokenizer has more tokens than the model, or two ids share a string.
    """
    if len(tokenizer) > vocab_size:
        raise ExportError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab_size}")
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    tokens += [f"<madeupword{i}>" for i in range(vocab_size - len(tokens))]
    if len(set(tokens)) != len(tokens):
        raise ExportError("the tokenizer maps two ids to the same token string; CTranslate2 needs unique tokens")
    return tokens


def _ct2_converter(model, tokenizer, ctranslate2):
    """A ``ctranslate2.converters.Converter`` whose ``_load`` builds the spec from our model."""

    class OurTransformerConverter(ctranslate2.converters.Converter):
        def _load(self):
            spec = transformer_spec(model, ctranslate2)
            tokens = vocabulary(tokenizer, model.config.vocab_size)
            spec.register_source_vocabulary(tokens)
            spec.register_target_vocabulary(tokens)
            spec.config.unk_token = tokenizer.unk_token
            spec.config.bos_token = tokens[model.config.bos_token_id]
            spec.config.eos_token = tokens[model.config.eos_token_id]
            spec.config.decoder_start_token = tokens[model.config.decoder_start_token_id]
            spec.config.add_source_bos = False
            spec.config.add_source_eos = False  # our tokenizer appends </s> itself
            spec.config.layer_norm_epsilon = model.config.layer_norm_eps
            return spec

    return OurTransformerConverter()


def export_ct2(
    src: str | os.PathLike,
    export_dir: str | os.PathLike,
    *,
    quantization: str = "int8",
    overwrite: bool = False,
) -> Path:
    """Write ``export_dir``: a CTranslate2 model (``model.bin``, ``config.json``, vocabularies),
    our tokenizer, ``generation_config.json`` and ``attention_seq2seq_ct2.json``.

    Args:
        src: a training output folder or a ``save_pretrained`` folder of our Transformer.
        export_dir: the folder to write.
        quantization: the stored weight type, one of ``QUANTIZATIONS`` (int8: 8-bit weights with
            per-row scales, computed in int8 on CPUs).
        overwrite: replace a non-empty ``export_dir``.

    Raises:
        CT2ExportRefused: the RNN family or ScaleNorm.
        ExportError: bad source/destination or quantization, ctranslate2 not installed.
    """
    if quantization not in QUANTIZATIONS:
        raise ExportError(f"--quantization {quantization!r}: choose one of {', '.join(QUANTIZATIONS)}")
    src, export_dir = Path(src), Path(export_dir)
    sources = resolve_sources(src)
    _check_destination(export_dir, src, overwrite)
    check_ct2_convertible(_read_config_json(sources.model_dir))
    ctranslate2 = _import_ctranslate2()
    from transformers import AutoTokenizer

    from ..modeling.modeling_transformer_seq2seq import TransformerSeq2SeqForConditionalGeneration

    model = TransformerSeq2SeqForConditionalGeneration.from_pretrained(sources.model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(sources.model_dir, trust_remote_code=False)
    _reset_tokenizer_runtime_state(tokenizer)

    def write(staging: Path) -> None:
        staging.mkdir()
        with torch.no_grad():
            _ct2_converter(model, tokenizer, ctranslate2).convert(str(staging), quantization=quantization, force=True)
        tokenizer.save_pretrained(staging)
        generation = model.generation_config
        generation.save_pretrained(staging)
        marker = {
            "format": "ctranslate2",
            "quantization": quantization,
            "source_model_type": model.config.model_type,
            "max_position_embeddings": model.config.max_position_embeddings,
            "ctranslate2_version": ctranslate2.__version__,
        }
        (staging / MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    write_atomically(export_dir, write)
    return export_dir
