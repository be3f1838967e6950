"""The RNN encoder-decoder with attention as a transformers v5 model (``model_type="rnn_seq2seq"``).

Read top to bottom: the decoder cache, the encoder, the bridge, the decoder (three variants:
no attention, Bahdanau, Luong), then the transformers classes. The attention scores live in
``rnn_attention.py``.

Variants (all chosen in ``RNNSeq2SeqConfig``):
- ``attention="none"``: Sutskever et al. (2014) / Cho et al. (2014); the decoder sees the source
  only through its bridged initial state.
- ``attention="bahdanau"``: Bahdanau et al. (2015) in the paper's step order: score on s_{i-1},
  context c_i, a maxout deep output on (s_{i-1}, E y_{i-1}, c_i) (A.2.2), and the state update
  s_i = f(s_{i-1}, [E y_{i-1}; c_i]) (A.2.1) carried to the next step.
- ``attention="luong"``: Luong et al. (2015): h_t = RNN first, then a_t from score(h_t, h̄_s),
  c_t, h̃_t = tanh(W_c [c_t; h_t]) (eq. 5), p(y_t) = softmax(W_s h̃_t) (eq. 6); global or
  local-m/local-p windows (§3.2), input feeding (§3.3) on or off.

Speed: a decoder whose step t does not depend on step t-1's attention (no attention, or Luong
without input feeding and without coverage) runs its RNN over the whole target in one cuDNN/oneDNN
call and attends every position with one batched matmul. The other variants loop over target
positions with the key projections precomputed once per source and the output layers (deep
output, ``lm_head``) applied once to all steps. Every layer is called as a module; the one direct
weight read, torch's fused single-step LSTM/GRU cell kernels in the step loop, applies only to an
exactly ``nn.LSTM``/``nn.GRU`` with plain parameters and no hooks (``plain_cell_weights``), so a
quantized, wrapped or hooked RNN is called instead.

Memory: ``gradient_checkpointing_enable()`` checkpoints the encoder's stacked RNN and each decoder
step (the whole decoder for the parallel variants), recomputed in backward with the same gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from transformers import GenerationConfig, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import ModelOutput, Seq2SeqLMOutput, Seq2SeqModelOutput

from ..configuration.configuration_rnn_seq2seq import RNNSeq2SeqConfig
from .cpu_fast_paths import has_hooks
from .generation_lengths import Seq2SeqGenerationMixin
from .losses import shift_tokens_right
from .saving import Seq2SeqSavingMixin
from .seq2seq_base import Seq2SeqLMMixin, Seq2SeqModelMixin
from .rnn_attention import BahdanauAttention, LuongAttention, luong_attentional_state, maxout

# Imported for its side effect on save_pretrained, which copies the model file and the flat
# siblings it imports: a re-saved remote-code model then keeps the pipeline that
# config.custom_pipelines names, and pipeline("translation", model=<re-saved folder>) still loads.
from .pipeline_translation import Seq2SeqTranslationPipeline  # noqa: F401

_RNN_CLASSES = {"gru": nn.GRU, "lstm": nn.LSTM}
# Bahdanau et al. (2015), A.2.2: the deep output is a maxout layer with pools of two units.
BAHDANAU_MAXOUT_POOL = 2


def plain_cell_weights(rnn: nn.Module) -> list[tuple[torch.Tensor, ...]] | None:
    """Each layer's (w_ih, w_hh, b_ih, b_hh) of ``rnn`` when the fused cell kernels may stand in for
    calling it, else None.

    Only an exact ``nn.LSTM``/``nn.GRU`` (not a subclass, a quantized or parametrized replacement)
    with plain ``nn.Parameter`` weights, biases, one direction, no LSTM projection and no hooks
    qualifies; anything else must be called so that it does its own work.
    """
    if type(rnn) not in (nn.LSTM, nn.GRU) or has_hooks(rnn):
        return None
    if rnn.bidirectional or not rnn.bias or getattr(rnn, "proj_size", 0):
        return None
    names = ("weight_ih_l{}", "weight_hh_l{}", "bias_ih_l{}", "bias_hh_l{}")
    weights = []
    for layer in range(rnn.num_layers):
        layer_weights = tuple(getattr(rnn, name.format(layer), None) for name in names)
        if any(type(w) is not nn.Parameter for w in layer_weights):
            return None
        weights.append(layer_weights)
    return weights


# ---------------------------------------------------------------------------------------------
# Decoder state
# ---------------------------------------------------------------------------------------------


@dataclass(eq=False, repr=False)
class RNNDecoderCache:
    """The whole decoder state between two calls: what generation carries from step to step.

    Tensors (any may be None when the variant does not use it):
        hidden: RNN hidden state s / h, (decoder_layers, batch, hidden_size).
        cell: LSTM cell state, (decoder_layers, batch, hidden_size).
        attentional_state: Luong's h̃_{t-1} for input feeding, (batch, hidden_size).
        coverage: Σ of past attention weights, (batch, src_len).
        keys: the attention's key projection of the source (U_a h_j, W_a h̄_s, ...), computed once
            per source, (batch, src_len, key_size).
    ``seen_tokens`` counts the target tokens consumed so far (the next token's position t).

    ``reorder_cache(beam_idx)`` index-selects every tensor along its batch dimension; beam search
    calls it after each step.
    """

    # hidden and cell keep the (layers, batch, hidden) layout torch's RNNs take.
    _BATCH_DIM = {"hidden": 1, "cell": 1, "attentional_state": 0, "coverage": 0, "keys": 0}
    is_compileable = False
    is_linear = (True,)  # a recurrent state: generate must not slice inputs by a key/value length

    hidden: torch.Tensor
    cell: torch.Tensor | None = None
    attentional_state: torch.Tensor | None = None
    coverage: torch.Tensor | None = None
    keys: torch.Tensor | None = None
    seen_tokens: int = 0

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self._BATCH_DIM if getattr(self, name) is not None}

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        for name, tensor in self.tensors().items():
            dim = self._BATCH_DIM[name]
            setattr(self, name, tensor.index_select(dim, beam_idx.to(tensor.device)))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    @property
    def rnn_state(self):
        return self.hidden if self.cell is None else (self.hidden, self.cell)

    @rnn_state.setter
    def rnn_state(self, state) -> None:
        if isinstance(state, tuple):
            self.hidden, self.cell = state
        else:
            self.hidden = state

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={tuple(v.shape)}" for k, v in self.tensors().items())
        return f"{type(self).__name__}({shapes}, seen_tokens={self.seen_tokens})"


@dataclass
class RNNEncoderOutput(ModelOutput):
    """Encoder output. Every tensor is batch-first so generate can expand it for beams.

    last_hidden_state: h_j = [h→_j; h←_j] of the top layer, (batch, src_len, encoder_output_size);
        zero at padding.
    final_hidden_state: each layer's last states [h→_S; h←_1], (batch, encoder_layers,
        encoder_output_size).
    final_cell_state: the same for an LSTM's cell, or None.
    hidden_states: (last_hidden_state,) when asked for (torch's stacked RNN exposes the top layer only).
    """

    last_hidden_state: torch.Tensor | None = None
    final_hidden_state: torch.Tensor | None = None
    final_cell_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


@dataclass
class RNNSeq2SeqModelOutput(Seq2SeqModelOutput):
    """``Seq2SeqModelOutput`` plus the coverage penalty Σ_i min(a_i^t, c_i^t) (See et al. 2017,
    eq. 12) of every target position, (batch, tgt_len), when coverage is on."""

    coverage_penalty: torch.Tensor | None = None


@dataclass
class RNNSeq2SeqLMOutput(Seq2SeqLMOutput):
    """``Seq2SeqLMOutput`` plus ``coverage_penalty`` (batch, tgt_len), so a trainer that builds its
    own (e.g. sum-reduced) loss from ``logits`` can add
    ``coverage_loss_weight * coverage_penalty[labels != -100].sum()``."""

    coverage_penalty: torch.Tensor | None = None


# ---------------------------------------------------------------------------------------------
# Encoder and bridge
# ---------------------------------------------------------------------------------------------


class RNNSeq2SeqEncoder(nn.Module):
    """Embeddings → dropout → (bi)directional stacked GRU/LSTM over packed sequences.

    Packing means padding never enters a state: the backward direction starts at each sentence's
    last real token and the final states are those of the real last tokens. Sources must be
    right-padded.
    """

    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        self.rnn = _RNN_CLASSES[config.cell_type](
            config.embedding_size,
            config.encoder_hidden_size,
            num_layers=config.encoder_layers,
            bidirectional=config.bidirectional,
            dropout=config.dropout if config.encoder_layers > 1 else 0.0,
            batch_first=True,
        )
        self.num_layers = config.encoder_layers
        self.num_directions = config.num_directions
        self.gradient_checkpointing = False  # set by gradient_checkpointing_enable()

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> RNNEncoderOutput | tuple:
        """Encode right-padded ``input_ids`` (batch, src_len); ``attention_mask`` (batch, src_len) is
        1 on real tokens. ``output_attentions`` is accepted for generate's sake (there is no encoder
        attention).

        Raises:
            ValueError: a row of ``attention_mask`` is all 0 (a sentence without a real token),
                naming the rows.
        """
        batch = input_ids.size(0)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        lengths = attention_mask.sum(-1).cpu()
        if bool((lengths == 0).any()):
            rows = (lengths == 0).nonzero().flatten().tolist()
            raise ValueError(
                f"attention_mask row(s) {rows} are all 0: every source sentence needs at least one real token"
            )

        embeds = self.dropout(self.embed_tokens(input_ids))  # (batch, src_len, embedding_size)
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            # The stacked RNN's activations are recomputed in backward; the embeddings are its input.
            outputs, final_hidden, final_cell = self._gradient_checkpointing_func(self._run_rnn, embeds, lengths)
        else:
            outputs, final_hidden, final_cell = self._run_rnn(embeds, lengths)

        def per_layer(final: torch.Tensor) -> torch.Tensor:
            # (layers * directions, batch, hidden) -> (batch, layers, directions * hidden)
            final = final.view(self.num_layers, self.num_directions, batch, -1)
            return final.permute(2, 0, 1, 3).reshape(batch, self.num_layers, -1)

        output = RNNEncoderOutput(
            last_hidden_state=outputs,
            final_hidden_state=per_layer(final_hidden),
            final_cell_state=per_layer(final_cell) if final_cell is not None else None,
            hidden_states=(outputs,) if output_hidden_states else None,
        )
        return output if return_dict is not False else output.to_tuple()

    def _run_rnn(self, embeds: torch.Tensor, lengths: torch.Tensor):
        """The stacked RNN over ``embeds`` (batch, src_len, embedding_size) packed by ``lengths``:
        top-layer outputs (batch, src_len, encoder_output_size), zero at padding, and the final
        hidden (and LSTM cell, else None) states, (layers * directions, batch, encoder_hidden_size)."""
        packed = pack_padded_sequence(embeds, lengths, batch_first=True, enforce_sorted=False)
        packed_out, state = self.rnn(packed)
        outputs, _ = pad_packed_sequence(packed_out, batch_first=True, total_length=embeds.size(1))
        final_hidden, final_cell = (state, None) if not isinstance(state, tuple) else state
        return outputs, final_hidden, final_cell


class RNNBridge(nn.Module):
    """The decoder's initial state from the encoder's final states, layer by layer.

    "zero": s_0 = 0. "last": s_0^l = [h→_S; h←_1]^l. "projection": s_0^l = tanh(W^l [h→_S; h←_1]^l)
    (Bahdanau et al. 2015, A.2.2 initialise s_0 = tanh(W_s h←_1) from the backward state only; we
    give the projection both directions). An LSTM's cell state gets its own W^l.
    """

    def __init__(self, config):
        super().__init__()
        self.kind = config.bridge
        self.num_layers = config.decoder_layers
        self.hidden_size = config.hidden_size
        self.is_lstm = config.cell_type == "lstm"
        self.hidden_proj = self.cell_proj = None
        if self.kind == "projection":

            def projections():
                return nn.ModuleList(
                    nn.Linear(config.encoder_output_size, config.hidden_size) for _ in range(config.decoder_layers)
                )

            self.hidden_proj = projections()
            self.cell_proj = projections() if self.is_lstm else None

    def _bridge(self, final: torch.Tensor, projections: nn.ModuleList | None) -> torch.Tensor:
        if self.kind == "last":
            return final.transpose(0, 1).contiguous()  # (layers, batch, hidden_size)
        layers = [torch.tanh(proj(final[:, layer])) for layer, proj in enumerate(projections)]
        return torch.stack(layers)  # (layers, batch, hidden_size)

    def forward(self, final_hidden_state: torch.Tensor, final_cell_state: torch.Tensor | None):
        """final_*_state: (batch, encoder_layers, encoder_output_size).
        Returns hidden (and cell for an LSTM, else None): (decoder_layers, batch, hidden_size)."""
        if self.kind == "zero":
            zeros = final_hidden_state.new_zeros(self.num_layers, final_hidden_state.size(0), self.hidden_size)
            return zeros, (zeros.clone() if self.is_lstm else None)
        hidden = self._bridge(final_hidden_state, self.hidden_proj)
        cell = self._bridge(final_cell_state, self.cell_proj) if self.is_lstm else None
        return hidden, cell


# ---------------------------------------------------------------------------------------------
# Decoder
# ---------------------------------------------------------------------------------------------


class RNNSeq2SeqDecoder(nn.Module):
    """Decoder for every variant; ``forward`` consumes ``input_ids`` from the state in ``cache``.

    Output feature (the vector ``lm_head`` reads, ``config.output_feature_size``):
    - none: the top RNN state s_t.
    - Bahdanau: t_i = maxout(U_o s_{i-1} + V_o E y_{i-1} + C_o c_i) (A.2.2). Eq. 4 of the main text
      writes g(y_{i-1}, s_i, c_i); we follow the appendix, which specifies the model in full: y_i is
      predicted from s_{i-1}, y_{i-1} and c_i, and s_i is only carried to the next step.
    - Luong: h̃_t = tanh(W_c [c_t; h_t]) (eq. 5).
    """

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.kind = config.attention
        self.input_feeding = config.input_feeding
        self.use_coverage = config.coverage
        self.stepwise = config.is_stepwise
        self.gradient_checkpointing = False  # set by gradient_checkpointing_enable(): each step is checkpointed

        self.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        self.bridge = RNNBridge(config)

        rnn_input_size = config.embedding_size
        if self.kind == "bahdanau":
            rnn_input_size += config.encoder_output_size  # [E y_{i-1}; c_i]  (A.2.1)
        if self.input_feeding:
            rnn_input_size += config.hidden_size  # [E y_{t-1}; h̃_{t-1}]  (Luong §3.3)
        self.rnn = _RNN_CLASSES[config.cell_type](
            rnn_input_size,
            config.hidden_size,
            num_layers=config.decoder_layers,
            dropout=config.dropout if config.decoder_layers > 1 else 0.0,
            batch_first=True,
        )

        if self.kind == "bahdanau":
            self.attention = BahdanauAttention(config)
            # [U_o; V_o; C_o] as one matrix over [s_{i-1}; E y_{i-1}; c_i], then maxout (A.2.2).
            deep_in = config.hidden_size + config.embedding_size + config.encoder_output_size
            self.deep_output = nn.Linear(deep_in, BAHDANAU_MAXOUT_POOL * config.embedding_size)
        elif self.kind == "luong":
            self.attention = LuongAttention(config)
            self.attn_combine = nn.Linear(
                config.encoder_output_size + config.hidden_size, config.hidden_size, bias=False
            )  # W_c
        else:
            self.attention = None

    def init_cache(self, encoder_outputs: RNNEncoderOutput, attention_mask: torch.Tensor) -> RNNDecoderCache:
        """State before the first target token: bridged s_0, zero h̃_0 and coverage, keys U h_j."""
        hidden, cell = self.bridge(encoder_outputs.final_hidden_state, encoder_outputs.final_cell_state)
        encoder_hidden_states = encoder_outputs.last_hidden_state
        batch, src_len, _ = encoder_hidden_states.shape
        cache = RNNDecoderCache(hidden=hidden, cell=cell)
        if self.attention is not None:
            cache.keys = self.attention.precompute_keys(encoder_hidden_states)
        if self.input_feeding:
            cache.attentional_state = hidden.new_zeros(batch, self.config.hidden_size)
        if self.use_coverage:
            cache.coverage = encoder_hidden_states.new_zeros(batch, src_len)
        return cache

    def forward(
        self,
        input_ids: torch.LongTensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: RNNDecoderCache,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """Run the decoder over ``input_ids`` (batch, tgt_len), continuing from ``cache``, which is
        updated in place.

        Args:
            encoder_hidden_states: (batch, src_len, encoder_output_size).
            attention_mask: bool (batch, src_len), True on real source tokens.

        Returns:
            features (batch, tgt_len, output_feature_size) for ``lm_head``; attention weights
            (batch, tgt_len, src_len) or None; coverage penalty (batch, tgt_len) or None; top RNN
            states (batch, tgt_len, hidden_size), the very tensor the output layers read (Bahdanau:
            s_i, read at step i + 1), so a gradient from the logits reaches them.
        """
        tgt_len = input_ids.size(1)
        start = cache.seen_tokens
        positions = torch.arange(start, start + tgt_len, device=input_ids.device)
        embeds = self.dropout(self.embed_tokens(input_ids))  # (batch, tgt_len, embedding_size)
        source = (cache.keys, encoder_hidden_states, attention_mask)

        if not self.stepwise:
            features, weights, rnn_outputs = self._checkpointed(
                self._forward_parallel, cache, embeds, *source, positions
            )
            coverage_penalty = None
        else:
            step = self._bahdanau_step if self.kind == "bahdanau" else self._luong_step
            # split() once: slicing embeds[:, t] in the loop would make backward build a full-size
            # zero gradient per step (quadratic in tgt_len).
            steps = [
                self._checkpointed(step, cache, embed_t, *source, positions[t : t + 1])
                for t, embed_t in enumerate(embeds.split(1, dim=1))
            ]
            columns = list(zip(*steps, strict=True))  # each output of the steps, over time

            def over_time(parts):  # (batch, tgt_len, ...); None stays None
                return torch.cat(parts, 1) if parts[0] is not None else None

            # The output layers need no recurrence: one matmul for all steps, which reads the top
            # RNN states returned as decoder_hidden_states, so these are on the path to the logits
            # (a gradient reaches them), not a copy made beside it.
            if self.kind == "bahdanau":
                contexts, weights, coverage_penalty, rnn_outputs = map(over_time, columns[1:])
                # A.2.2 reads s_{i-1}: s_0 (the first step's query), then s_1 .. s_{T-1} of this call.
                queries = torch.cat([columns[0][0], rnn_outputs[:, :-1]], dim=1)
                deep = self.deep_output(torch.cat([queries, embeds, contexts], dim=-1))
                features = maxout(deep, BAHDANAU_MAXOUT_POOL)
            else:
                rnn_outputs, contexts, weights, coverage_penalty = map(over_time, columns)
                features = luong_attentional_state(contexts, rnn_outputs, self.attn_combine)  # h̃_t (eq. 5)
        cache.seen_tokens = start + tgt_len
        return self.dropout(features), weights, coverage_penalty, rnn_outputs

    # The recurrent part of the cache: what one step reads and writes (keys stay fixed per source).
    _STATE_NAMES = ("hidden", "cell", "attentional_state", "coverage")

    def _checkpointed(self, step, cache: RNNDecoderCache, *inputs):
        """``step(cache, *inputs)``: advances the recurrent state in ``cache`` and returns a tuple of
        tensors (or None), here or, under gradient checkpointing, through ``_gradient_checkpointing_func``.

        Checkpointed, a step keeps only its inputs and outputs; its activations (the cell's gates,
        the additive score's (batch, tgt_len, src_len, hidden_size) features) are recomputed in
        backward. The recomputation must start from the state the step first saw, so the step then
        runs on a fresh cache built from the state tensors, and every tensor it reads enters as an
        input (reentrant checkpointing differentiates through its explicit inputs only).
        """
        if not (self.gradient_checkpointing and self.training and torch.is_grad_enabled()):
            return step(cache, *inputs)
        names = [name for name in self._STATE_NAMES if getattr(cache, name) is not None]
        present = []  # which outputs of step are tensors (the checkpoint function returns tensors only)

        def run(*tensors):
            local = RNNDecoderCache(**dict(zip(names, tensors[: len(names)], strict=True)))
            outputs = step(local, *tensors[len(names) :])
            present[:] = [output is not None for output in outputs]
            return (*(output for output in outputs if output is not None), *(getattr(local, n) for n in names))

        results = self._gradient_checkpointing_func(run, *(getattr(cache, n) for n in names), *inputs)
        kept, state = iter(results[: len(results) - len(names)]), results[len(results) - len(names) :]
        for name, tensor in zip(names, state, strict=True):
            setattr(cache, name, tensor)
        return tuple(next(kept) if is_tensor else None for is_tensor in present)

    def _forward_parallel(self, cache, embeds, keys, encoder_hidden_states, attention_mask, positions):
        """No attention, or Luong without input feeding or coverage: one RNN call, one attention.
        Returns features, weights (or None), top RNN states."""
        rnn_outputs, cache.rnn_state = self.rnn(embeds, cache.rnn_state)  # (batch, tgt_len, hidden_size)
        if self.attention is None:
            return rnn_outputs, None, rnn_outputs
        context, weights = self.attention(rnn_outputs, keys, encoder_hidden_states, attention_mask, positions)
        return luong_attentional_state(context, rnn_outputs, self.attn_combine), weights, rnn_outputs

    def _rnn_step(self, rnn_input: torch.Tensor, cache: RNNDecoderCache) -> torch.Tensor:
        """One step of the stacked decoder RNN: (batch, 1, input_size) -> top layer (batch, 1, hidden_size).

        The reference path calls ``self.rnn`` on the length-1 step, so whatever stands in ``self.rnn``
        (a quantized, wrapped or hooked module) does the work. When ``self.rnn`` is exactly a plain
        ``nn.LSTM``/``nn.GRU`` (see ``plain_cell_weights``), the same parameters and arithmetic run
        through torch's fused single-step kernels instead: calling the stacked module once per token
        goes through a whole-sequence kernel (oneDNN on CPU), which is slower per step. Both paths
        use the same parameters, so the same parameters get gradients.
        """
        weights = plain_cell_weights(self.rnn)
        if weights is None:
            output, cache.rnn_state = self.rnn(rnn_input, cache.rnn_state)
            return output
        x = rnn_input.squeeze(1)  # (batch, input_size)
        hiddens, cells = [], []
        for layer, layer_weights in enumerate(weights):
            if cache.cell is not None:
                h, c = torch.lstm_cell(x, (cache.hidden[layer], cache.cell[layer]), *layer_weights)
                cells.append(c)
            else:
                h = torch.gru_cell(x, cache.hidden[layer], *layer_weights)
            hiddens.append(h)
            # dropout between layers while training, as the stacked module applies it
            x = h if layer == len(weights) - 1 else F.dropout(h, self.rnn.dropout, self.training)
        cache.hidden = torch.stack(hiddens)  # (decoder_layers, batch, hidden_size)
        if cells:
            cache.cell = torch.stack(cells)
        return x.unsqueeze(1)

    def _coverage_step(self, cache, weights_t):
        """Adds a_t to the coverage; returns See et al. (2017)'s eq. 12 penalty Σ_i min(a_i^t, c_i^t)
        (batch, 1), which reads the coverage *before* this step (eq. 10)."""
        penalty = torch.minimum(weights_t, cache.coverage.unsqueeze(1)).sum(-1)
        cache.coverage = cache.coverage + weights_t.squeeze(1)
        return penalty

    def _bahdanau_step(self, cache, embed_t, keys, encoder_hidden_states, attention_mask, position):
        """Bahdanau et al. (2015): e_ij from s_{i-1} (A.1.2) → c_i (eq. 5) → s_i = f(s_{i-1}, y_{i-1}, c_i).

        embed_t: E y_{i-1}, (batch, 1, embedding_size). Returns s_{i-1} (the query), c_i, a_i, the
        coverage penalty (or None) and s_i, each (batch, 1, ...).
        """
        query = cache.hidden[-1].unsqueeze(1)  # s_{i-1} of the top layer, (batch, 1, hidden_size)
        context, weights_t = self.attention(
            query, keys, encoder_hidden_states, attention_mask, position, cache.coverage
        )
        penalty = self._coverage_step(cache, weights_t) if self.use_coverage else None
        state_t = self._rnn_step(torch.cat([embed_t, context], dim=-1), cache)  # s_i, (batch, 1, hidden_size)
        return query, context, weights_t, penalty, state_t

    def _luong_step(self, cache, embed_t, keys, encoder_hidden_states, attention_mask, position):
        """Luong et al. (2015) with input feeding (§3.3) and/or coverage: h_t → a_t → c_t → h̃_t.

        embed_t: E y_t, (batch, 1, embedding_size). Returns h_t, c_t, a_t and the coverage penalty
        (or None), each (batch, 1, ...); the caller applies eq. 5 to all steps at once. With input
        feeding, h̃_t is also computed here, for the next step's input.
        """
        rnn_input = embed_t
        if self.input_feeding:
            rnn_input = torch.cat([embed_t, cache.attentional_state.unsqueeze(1)], dim=-1)
        state_t = self._rnn_step(rnn_input, cache)  # h_t, (batch, 1, hidden_size)
        context, weights_t = self.attention(
            state_t, keys, encoder_hidden_states, attention_mask, position, cache.coverage
        )
        penalty = self._coverage_step(cache, weights_t) if self.use_coverage else None
        if self.input_feeding:
            cache.attentional_state = luong_attentional_state(context, state_t, self.attn_combine).squeeze(1)  # h̃_t
        return state_t, context, weights_t, penalty


# ---------------------------------------------------------------------------------------------
# transformers classes
# ---------------------------------------------------------------------------------------------


def tied_weights_keys(config: RNNSeq2SeqConfig, with_lm_head: bool) -> dict[str, str]:
    """The parameters that are one tensor, as transformers v5 wants them: {target: source}, named from
    `RNNSeq2SeqModel`, or from the ForConditionalGeneration model (`model.` prefixed) with `lm_head`.

    With `share_embeddings` the decoder's token embeddings are the encoder's; with
    `tie_word_embeddings`, `lm_head` is the decoder's (so the shared) embedding matrix.
    """
    prefix = "model." if with_lm_head else ""
    keys = {}
    if config.share_embeddings:
        keys[f"{prefix}decoder.embed_tokens.weight"] = f"{prefix}encoder.embed_tokens.weight"
    if with_lm_head and config.tie_word_embeddings:
        source = "encoder" if config.share_embeddings else "decoder"
        keys["lm_head.weight"] = f"model.{source}.embed_tokens.weight"
    return keys


class RNNSeq2SeqPreTrainedModel(Seq2SeqSavingMixin, PreTrainedModel):
    config_class = RNNSeq2SeqConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["RNNSeq2SeqEncoder", "RNNSeq2SeqDecoder"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Every parameter uniform in [-init_range, init_range] (Luong et al. 2015, §4.1); the
        padding embedding starts at zero."""
        bound = self.config.init_range
        for param in module.parameters(recurse=False):
            init.uniform_(param, -bound, bound)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            if not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict[str, str]:
        # transformers ties nothing unless `tie_word_embeddings` is set, but the encoder/decoder
        # sharing (`share_embeddings`) is independent of the output tying: the full {target: source}
        # mapping of this model (submodules included) is read from the config here.
        return tied_weights_keys(self.config, with_lm_head=hasattr(self, "lm_head"))


class RNNSeq2SeqModel(Seq2SeqModelMixin, RNNSeq2SeqPreTrainedModel):
    """The bare encoder-decoder; ``last_hidden_state`` is the decoder's output feature per target
    position (batch, tgt_len, output_feature_size), the vector ``lm_head`` reads."""

    def __init__(self, config: RNNSeq2SeqConfig):
        super().__init__(config)
        self.encoder = RNNSeq2SeqEncoder(config)
        self.decoder = RNNSeq2SeqDecoder(config)
        self._tied_weights_keys = tied_weights_keys(config, with_lm_head=False)  # read by save_pretrained
        self.post_init()

    def encoder_outputs_from_tuple(self, outputs: tuple) -> RNNEncoderOutput:
        # The encoder's to_tuple() drops None fields: (last, final_h[, final_c][, hidden_states]).
        fields = ["last_hidden_state", "final_hidden_state"]
        if self.config.cell_type == "lstm":
            fields.append("final_cell_state")
        fields.append("hidden_states")
        if not len(fields) - 1 <= len(outputs) <= len(fields):
            raise ValueError(f"encoder_outputs as a tuple must hold {fields}; got {len(outputs)} items")
        return RNNEncoderOutput(**dict(zip(fields, outputs)))  # noqa: B905 (hidden_states is optional)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.encoder.embed_tokens = value
        if self.config.share_embeddings:
            self.decoder.embed_tokens = value

    def decode(
        self,
        decoder_input_ids: torch.LongTensor,
        encoder_outputs: RNNEncoderOutput,
        attention_mask: torch.Tensor | None,
        decoder_attention_mask: torch.Tensor | None,
        cache: RNNDecoderCache | None,
        use_cache: bool,
        output_attentions: bool,
        output_hidden_states: bool,
    ) -> RNNSeq2SeqModelOutput:
        """The decoder over `encoder_outputs` (see `Seq2SeqModelMixin.forward`), continuing from `cache`
        (updated in place) or from the bridged encoder state. `decoder_attention_mask` is unused: the
        decoder is a causal RNN over right-padded targets, so padding cannot reach earlier positions.

        Returns:
            `RNNSeq2SeqModelOutput`; `cross_attentions` (with `output_attentions`) is a tuple holding
            one (batch, 1, tgt_len, src_len) tensor (one "head", one decoder attention).
        """
        encoder_hidden_states = encoder_outputs.last_hidden_state
        if attention_mask is None:
            attention_mask = torch.ones(
                encoder_hidden_states.shape[:2], dtype=torch.bool, device=encoder_hidden_states.device
            )
        attention_mask = attention_mask.bool()
        if cache is None:
            cache = self.decoder.init_cache(encoder_outputs, attention_mask)
        features, weights, coverage_penalty, rnn_outputs = self.decoder(
            decoder_input_ids, encoder_hidden_states, attention_mask, cache
        )
        return RNNSeq2SeqModelOutput(
            last_hidden_state=features,
            cache=cache if use_cache else None,
            decoder_hidden_states=(rnn_outputs,) if output_hidden_states else None,
            cross_attentions=(weights.unsqueeze(1),) if output_attentions and weights is not None else None,
            encoder_last_hidden_state=encoder_hidden_states,
            encoder_hidden_states=encoder_outputs.hidden_states,
            coverage_penalty=coverage_penalty,
        )


class RNNSeq2SeqForConditionalGeneration(Seq2SeqLMMixin, RNNSeq2SeqPreTrainedModel, Seq2SeqGenerationMixin):
    """``RNNSeq2SeqModel`` plus ``lm_head``: p(y_t | y_<t, x) = softmax(W_s f_t) (Luong eq. 6;
    Bahdanau A.2.2 W_o t_i), with label-smoothed cross-entropy and the coverage loss."""

    lm_output_class = RNNSeq2SeqLMOutput

    def __init__(self, config: RNNSeq2SeqConfig):
        super().__init__(config)
        self.model = RNNSeq2SeqModel(config)
        self.lm_head = nn.Linear(config.output_feature_size, config.vocab_size, bias=False)
        self._tied_weights_keys = tied_weights_keys(config, with_lm_head=True)  # read by save_pretrained
        self.post_init()
        self.set_generation_defaults(config)

    # A recurrent state cannot be rolled back to an earlier prefix, which assisted (speculative)
    # decoding needs: transformers' generate refuses assistant_model up front for stateful models.
    _is_stateful = True

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # The decoder state is an RNNDecoderCache, not key/value pairs; generate must not build a DynamicCache.
        return False

    def _prepare_generation_config(self, generation_config: GenerationConfig | None, **kwargs):
        """transformers' preparation, then a refusal, before anything is encoded, of a key/value cache
        implementation (static, offloaded, quantized, ...), which transformers would otherwise ignore
        with a log line for a model that builds its own decoder state."""
        generation_config, model_kwargs = super()._prepare_generation_config(generation_config, **kwargs)
        implementation = generation_config.cache_implementation
        if implementation not in (None, "dynamic"):
            raise ValueError(
                f"cache_implementation={implementation!r} is not supported by {type(self).__name__}: its decoder "
                "carries its own recurrent state (RNNDecoderCache: RNN states, input feeding, coverage), not a "
                "key/value cache; leave cache_implementation unset (or 'dynamic') for dynamic decoding"
            )
        return generation_config, model_kwargs

    def _expand_inputs_for_generation(self, expand_size=1, is_encoder_decoder=False, input_ids=None, **model_kwargs):
        """Repeat the inputs for beams or several returned sequences, after reading `encoder_outputs`
        given as a tuple (`RNNEncoderOutput.to_tuple()`) into an `RNNEncoderOutput`: transformers
        expands only a dict of tensors, and failed on a tuple with an obscure `TypeError`."""
        encoder_outputs = model_kwargs.get("encoder_outputs")
        if encoder_outputs is not None and not isinstance(encoder_outputs, RNNEncoderOutput):
            model_kwargs["encoder_outputs"] = self.model.encoder_outputs_from_tuple(tuple(encoder_outputs))
        return super()._expand_inputs_for_generation(
            expand_size, is_encoder_decoder=is_encoder_decoder, input_ids=input_ids, **model_kwargs
        )

    def prepare_inputs_for_generation(
        self, input_ids: torch.LongTensor, cache: RNNDecoderCache | None = None, **kwargs
    ):
        """Feed the decoder only the tokens the cache has not consumed (the last one, after the first
        step); without a cache, the whole prefix."""
        kwargs.pop("next_sequence_length", None)
        model_inputs = super().prepare_inputs_for_generation(input_ids, cache=cache, **kwargs)
        if cache is not None:
            model_inputs["decoder_input_ids"] = model_inputs["decoder_input_ids"][:, cache.get_seq_length() :]
        return model_inputs


__all__ = [
    "RNNDecoderCache",
    "RNNEncoderOutput",
    "RNNSeq2SeqForConditionalGeneration",
    "RNNSeq2SeqLMOutput",
    "RNNSeq2SeqModel",
    "RNNSeq2SeqPreTrainedModel",
    "shift_tokens_right",
]
