"""The two ONNX graphs of a model, as PyTorch modules that call the model's own modules.

A translation is an encoder pass, then one decoder step per target token. ``export --format onnx``
traces each part of both families into a graph of plain tensors in and out:

``encoder.onnx``: ``input_ids``, ``attention_mask`` (batch, src_len) int64 → what every decoder
step reads of the source (fixed while a sentence is decoded) and, for the RNN, the decoder's
initial recurrent state.

``decoder.onnx``: ``decoder_input_ids`` (batch, 1) int64, ``position`` (1,) int64 (the index t of
that token in the target), the source tensors and the state → ``logits`` (batch, vocab_size)
float32, their ``log_probs`` (log softmax, what search adds up) and the state after the step
(``next_<name>``).

What is carried, per family:

- Transformer: the source side is each decoder layer's cross-attention keys and values of the
  encoder output, projected once (``cross_key_<layer>``/``cross_value_<layer>``, (batch, heads,
  src_len, head_dim)) and the source ``attention_mask``; the state is the self-attention key/value
  cache (``past_key_<layer>``/``past_value_<layer>``, (batch, heads, t, head_dim)), empty before
  the first step. One tensor per layer, not one stacked over layers: reading a layer out of a
  stacked input would copy it at every step.
- RNN: the source side is the encoder output h_j (``encoder_hidden_states``), the attention's key
  projection of it (``keys``: U_a h_j for Bahdanau, W_a h̄_s for Luong general, ...) and the mask;
  the state is the decoder RNN's ``hidden`` (and LSTM ``cell``) (layers, batch, hidden_size),
  Luong's input-feeding vector h̃_{t-1} (``attentional_state``) and the coverage vector Σ a
  (``coverage``, (batch, src_len)), each only where the variant has it. local-m / local-p read
  the position t from ``position`` (eq. 9's p_t for local-p is computed inside the step).

Each graph's interface (names, which axis is the batch, which decoder input an encoder output
feeds) is written to the export's ``attention_seq2seq_onnx.json`` by :func:`graph_interface`, and
the runtime (translation/onnx_runtime.py) reads only that file and the graphs.

The wrappers are traced with the model in eval mode, float32, eager attention and the CPU fast
paths off (``use_cpu_fast_paths=False``): the reference arithmetic, which the exported graph
reproduces to float rounding (hub/export_onnx.py checks it on real sentences before writing).
"""

from __future__ import annotations

import torch
from torch import nn

#: Each named tensor's axes (for the graphs' dynamic shapes): "batch", "src_len", "past" or a size.
AXES = {
    "input_ids": ("batch", "src_len"),
    "attention_mask": ("batch", "src_len"),
    "decoder_input_ids": ("batch", 1),
    "position": (1,),
    "logits": ("batch", "vocab"),
    "log_probs": ("batch", "vocab"),
    "encoder_hidden_states": ("batch", "src_len", "features"),
    "keys": ("batch", "src_len", "key_size"),
    "hidden": ("layers", "batch", "hidden_size"),
    "cell": ("layers", "batch", "hidden_size"),
    "attentional_state": ("batch", "hidden_size"),
    "coverage": ("batch", "src_len"),
}


#: The Transformer's per-layer tensors, by name prefix (``cross_key_0``, ``past_value_2``, ...).
LAYER_AXES = {
    "cross_key_": ("batch", "heads", "src_len", "head_dim"),
    "cross_value_": ("batch", "heads", "src_len", "head_dim"),
    "past_key_": ("batch", "heads", "past", "head_dim"),
    "past_value_": ("batch", "heads", "past", "head_dim"),
    "next_past_key_": ("batch", "heads", "past_plus_one", "head_dim"),
    "next_past_value_": ("batch", "heads", "past_plus_one", "head_dim"),
}


def axes_of(name: str) -> tuple:
    """The axes of a graph input/output (``next_<name>`` has those of ``<name>`` unless named)."""
    if name in AXES:
        return AXES[name]
    for prefix, axes in LAYER_AXES.items():
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            return axes
    return AXES[name.removeprefix("next_")]


def batch_axis(name: str) -> int:
    return axes_of(name).index("batch")


def dynamic_axes(names) -> dict[str, dict[int, str]]:
    """``torch.onnx.export``'s ``dynamic_axes`` for the named graph inputs/outputs."""
    return {name: {i: a for i, a in enumerate(axes_of(name)) if isinstance(a, str)} for name in names}


# ---------------------------------------------------------------------------------------------
# RNN


def rnn_state_names(config) -> list[str]:
    """The recurrent state of the RNN variant ``config``, in the graphs' order."""
    names = ["hidden"]
    if config.cell_type == "lstm":
        names.append("cell")
    if config.attention == "luong" and config.input_feeding:
        names.append("attentional_state")
    if config.attention != "none" and config.coverage:
        names.append("coverage")
    return names


def rnn_source_names(config) -> list[str]:
    """What every RNN decoder step reads of the source (besides ``attention_mask``)."""
    return ["encoder_hidden_states"] + (["keys"] if config.attention != "none" else [])


class RNNEncoderGraph(nn.Module):
    """Encoder, bridge and the attention's key projection (``RNNSeq2SeqDecoder.init_cache``):
    (input_ids, attention_mask) → source tensors, then the initial state (``rnn_state_names``)."""

    def __init__(self, model):
        super().__init__()
        self.encoder = model.model.encoder
        self.decoder = model.model.decoder
        self.config = model.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        outputs = self.encoder(input_ids, attention_mask, return_dict=True)
        cache = self.decoder.init_cache(outputs, attention_mask.bool())
        sources = [outputs.last_hidden_state] + ([cache.keys] if cache.keys is not None else [])
        return (*sources, *(getattr(cache, name) for name in rnn_state_names(self.config)))


def rnn_decoder_inputs(config) -> list[str]:
    """The RNN step graph's inputs: exactly those the variant reads (a traced graph drops the
    others), so the step's position only for local-m (p_t = t, Luong et al. 2015 §3.2) and the
    source only with attention."""
    names = ["decoder_input_ids"]
    if config.attention == "luong" and config.window == "local-m":
        names.append("position")
    if config.attention != "none":
        names += ["attention_mask", *rnn_source_names(config)]
    return names + rnn_state_names(config)


class RNNDecoderStepGraph(nn.Module):
    """One RNN decoder step (``RNNSeq2SeqDecoder.forward`` on one token) and ``lm_head``; takes
    the tensors :func:`rnn_decoder_inputs` names, in that order."""

    def __init__(self, model):
        super().__init__()
        self.decoder = model.model.decoder
        self.lm_head = model.lm_head
        self.state_names = rnn_state_names(model.config)
        self.input_names = rnn_decoder_inputs(model.config)

    def forward(self, *tensors):
        from ..modeling.modeling_rnn_seq2seq import RNNDecoderCache

        inputs = dict(zip(self.input_names, tensors, strict=True))
        cache = RNNDecoderCache(**{name: inputs[name] for name in self.state_names}, keys=inputs.get("keys"))
        # A tensor: the step's position t stays an input of the graph (only local-m reads it).
        cache.seen_tokens = inputs["position"][0] if "position" in inputs else 0
        input_ids = inputs["decoder_input_ids"]
        encoder_hidden_states = inputs.get("encoder_hidden_states")
        mask = inputs["attention_mask"].bool() if "attention_mask" in inputs else None
        features, _, _, _ = self.decoder(input_ids, encoder_hidden_states, mask, cache)
        logits = self.lm_head(features[:, -1]).float()  # (batch, vocab_size)
        return (logits, torch.log_softmax(logits, dim=-1), *(getattr(cache, name) for name in self.state_names))


# ---------------------------------------------------------------------------------------------
# Transformer


class TransformerEncoderGraph(nn.Module):
    """Encoder, then each decoder layer's cross-attention K and V of its output (projected once per
    source, as the cache holds them): (input_ids, attention_mask) → cross_key_0, cross_value_0,
    cross_key_1, ... (batch, heads, src_len, head_dim)."""

    def __init__(self, model):
        super().__init__()
        self.encoder = model.model.encoder
        self.layers = model.model.decoder.layers

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        encoded = self.encoder(input_ids, attention_mask, return_dict=True).last_hidden_state
        outputs = []
        for layer in self.layers:
            attention = layer.encoder_attn
            (key,) = attention._split_heads(attention.k_proj(encoded), 1)
            (value,) = attention._split_heads(attention.v_proj(encoded), 1)
            outputs += [key, value]
        return tuple(outputs)


class TransformerDecoderStepGraph(nn.Module):
    """One decoder step over the key/value cache: the decoder's own layers read an
    ``EncoderDecoderCache`` filled from the graph's inputs, and ``output_logits`` (FixNorm
    included) gives the logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.decoder = model.model.decoder

    def forward(self, decoder_input_ids, position, attention_mask, *tensors):
        """``tensors``: cross_key_0, cross_value_0, ..., then past_key_0, past_value_0, ...
        (``graph_interface``'s order)."""
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        decoder = self.decoder
        layers = len(decoder.layers)
        cross, past = tensors[: 2 * layers], tensors[2 * layers :]
        self_cache, cross_cache = DynamicCache(), DynamicCache()
        for index in range(layers):
            self_cache.update(past[2 * index], past[2 * index + 1], index)
            cross_cache.update(cross[2 * index], cross[2 * index + 1], index)
        cache = EncoderDecoderCache(self_cache, cross_cache)
        for index in range(len(decoder.layers)):
            cache.is_updated[index] = True
        embeddings = decoder.embed_tokens(decoder_input_ids)
        hidden = embeddings + decoder.embed_positions(1, position[0]).to(embeddings.dtype)
        cross_mask = attention_mask.bool()[:, None, None, :]
        for layer in decoder.layers:
            hidden, _, _ = layer(hidden, None, None, cross_mask, cache=cache, is_causal=False)
        if decoder.layer_norm is not None:
            hidden = decoder.layer_norm(hidden)
        logits = self.model.output_logits(hidden)[:, -1].float()  # (batch, vocab_size)
        state = [t for i in range(layers) for t in (self_cache.layers[i].keys, self_cache.layers[i].values)]
        return (logits, torch.log_softmax(logits, dim=-1), *state)


# ---------------------------------------------------------------------------------------------
# The interface both graphs share with the runtime


def graph_interface(model) -> dict:
    """Names and roles of every graph input and output (written to ``attention_seq2seq_onnx.json``):

    - ``encoder_outputs``: the encoder graph's outputs, in order;
    - ``sources``: encoder outputs every step reads unchanged (repeated for beams, never reordered);
    - ``state``: the decoder's recurrent inputs; the step returns ``next_<name>`` for each, and
      beam search reorders them along ``batch_axes[name]``;
    - ``initial_state``: how each state starts: ``"encoder"`` (an encoder output) or an empty
      shape (the Transformer's cache: ``["batch", heads, 0, head_dim]``);
    - ``decoder_inputs``: the step graph's inputs, in order;
    - ``shared_sources``: True when the step takes the source tensors once per source while its
      decoder rows are ``group`` consecutive beams of each source (the Transformer: cross-attention
      stacks the beams' queries, ``TransformerSeq2SeqAttention._stack_beams``, so each source's
      keys and values are read once per step, not once per beam); False: once per decoder row.
    """
    config = model.config
    if config.model_type == "rnn_seq2seq":
        sources = rnn_source_names(config)
        state = rnn_state_names(config)
        initial = {name: "encoder" for name in state}
        encoder_outputs = sources + state
        decoder_inputs = rnn_decoder_inputs(config)
    else:
        layers = range(config.decoder_layers)
        sources = [f"cross_{kind}_{i}" for i in layers for kind in ("key", "value")]
        state = [f"past_{kind}_{i}" for i in layers for kind in ("key", "value")]
        heads = config.decoder_attention_heads
        empty = ["batch", heads, 0, config.d_model // heads]
        initial = {name: empty for name in state}
        encoder_outputs = sources
        decoder_inputs = ["decoder_input_ids", "position", "attention_mask", *sources, *state]
    return {
        "encoder_inputs": ["input_ids", "attention_mask"],
        "encoder_outputs": encoder_outputs,
        "decoder_inputs": decoder_inputs,
        "decoder_outputs": ["logits", "log_probs", *(f"next_{name}" for name in state)],
        "sources": sources,
        "state": state,
        "initial_state": initial,
        "batch_axes": {name: batch_axis(name) for name in ["attention_mask", *sources, *state]},
        "shared_sources": config.model_type != "rnn_seq2seq",
    }


def graphs_of(model) -> tuple[nn.Module, nn.Module]:
    """(encoder graph module, decoder step module) of a model of either family."""
    if model.config.model_type == "rnn_seq2seq":
        graphs = RNNEncoderGraph(model), RNNDecoderStepGraph(model)
    else:
        graphs = TransformerEncoderGraph(model), TransformerDecoderStepGraph(model)
    # eval: a new module starts in training mode, and torch.onnx.export restores a module's mode
    # after tracing it in eval mode, which would switch the model's dropout back on
    return tuple(graph.eval() for graph in graphs)
