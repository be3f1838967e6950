"""The Transformer encoder-decoder of Vaswani et al. 2017, "Attention Is All You Need", as a
transformers v5 model.

Read top to bottom: the paper's equations as small functions and modules (scaled dot-product
attention, eq. 1; multi-head attention, §3.2.2; the position-wise feed-forward network, eq. 2;
sinusoidal positions, §3.5; scaled embeddings, §3.4), then the encoder and decoder layers, the two
stacks, and the transformers wrappers (`TransformerSeq2SeqModel`,
`TransformerSeq2SeqForConditionalGeneration`).

Design choices that differ from Marian/BART in transformers (each for speed, each noted where it
happens):

* with the CPU fast paths, projections that read the same input run as one matrix multiply
  (`project`): Q, K, V of self-attention and K, V of cross-attention, with the parameters kept as
  Marian's `q_proj`, `k_proj`, `v_proj` (and the layers called, whenever one is not a plain
  `nn.Linear`: LoRA, quantization, hooks);
* the decoder's self-attention needs no mask tensor in training (`is_causal` lets SDPA pick its
  fastest kernel);
* CPU speed work (eq. 1 as plain matmuls where torch's SDPA kernel is slower, float32 attention
  under half precision, cheaper dropout masks, the padding-free encoder, a prepacked `lm_head`,
  the fused loss) lives in cpu_fast_paths.py, reached through one seam, `fast_paths(config)`;
  `use_cpu_fast_paths=False` runs the plain reference code with the same numbers;
* no `final_logits_bias`: an extra (batch, tgt_len, vocab_size) tensor the paper does not have;
* beam search keeps one copy of each source's encoder output and cross-attention keys/values
  instead of one per beam (`_expand_inputs_for_generation`), and reorders only the
  self-attention cache (`_reorder_cache`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.integrations.flex_attention import flex_attention_forward
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.utils import logging

from ..configuration.configuration_transformer_seq2seq import TransformerSeq2SeqConfig

try:  # flex attention's mask type (torch >= 2.5)
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask
except ImportError:  # pragma: no cover - older torch: no flex attention, nothing is a BlockMask
    BlockMask, create_block_mask = (), None

# `label_smoothed_cross_entropy` and `shift_tokens_right` are re-exported: callers import them from here.
from .cpu_fast_paths import PaddingFreeLayout, fast_paths, label_smoothed_cross_entropy, plain_linears  # noqa: F401
from .generation_lengths import Seq2SeqGenerationMixin
from .losses import shift_tokens_right  # noqa: F401
from .saving import Seq2SeqSavingMixin
from .seq2seq_base import Seq2SeqLMMixin, Seq2SeqModelMixin

# Imported for its side effect on save_pretrained, which copies the model file and the flat
# siblings it imports: a re-saved remote-code model then keeps the pipeline that
# config.custom_pipelines names, and pipeline("translation", model=<re-saved folder>) still loads.
from .pipeline_translation import Seq2SeqTranslationPipeline  # noqa: F401

logger = logging.get_logger(__name__)

# --------------------------------------------------------------------------------------------
# Dropout and masks
# --------------------------------------------------------------------------------------------


def dropout(hidden_states: torch.Tensor, p: float, training: bool, config) -> torch.Tensor:
    """`F.dropout(hidden_states, p, training)` (Srivastava et al. 2014); with the CPU fast paths the
    same distribution, its masks drawn faster on a CPU (`cpu_fast_paths.dropout`)."""
    fast = fast_paths(config)
    return fast.dropout(hidden_states, p, training) if fast else F.dropout(hidden_states, p, training)


def causal_mask(tgt_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """Boolean (tgt_len, kv_len) mask, True where query i may attend to key j.

    The queries are the last `tgt_len` of `kv_len` positions (the first `kv_len - tgt_len` come
    from the cache), so query i sees keys 0 .. i + kv_len - tgt_len: the "masking out (setting to
    −∞) all values in the input of the softmax which correspond to illegal connections" of §3.2.3.
    """
    offset = kv_len - tgt_len
    return torch.arange(kv_len, device=device)[None, :] <= torch.arange(offset, kv_len, device=device)[:, None]


# --------------------------------------------------------------------------------------------
# §3.2.1 Scaled dot-product attention (eq. 1)
# --------------------------------------------------------------------------------------------


def scaled_dot_product_attention(query, key, value, attention_mask=None, is_causal=False, scaling=None, dropout=0.0):
    """Attention(Q, K, V) = softmax(QKᵀ / √d_k) V  (Vaswani et al. 2017, eq. 1).

    Args:
        query: (batch, num_heads, tgt_len, head_dim).
        key: (batch, num_heads, src_len, head_dim).
        value: (batch, num_heads, src_len, head_dim).
        attention_mask: boolean, broadcastable to (batch, num_heads, tgt_len, src_len); True where a
            query may attend to a key. Masked scores are set to the dtype's minimum before the
            softmax (−∞ in the paper; a finite value keeps a fully masked row finite).
        is_causal: also mask keys after each query (decoder self-attention, §3.2.3), aligned so that
            the last query sees every key.
        scaling: the factor on QKᵀ; defaults to 1/√d_k with d_k = head_dim. Pass 1.0 for the
            unscaled softmax(QKᵀ)V.
        dropout: dropout probability on the attention probabilities (0 at inference).

    Returns:
        (output, weights): output (batch, num_heads, tgt_len, head_dim) and the attention
        probabilities before dropout, (batch, num_heads, tgt_len, src_len), each row summing to 1.
    """
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling  # (batch, num_heads, tgt_len, src_len)
    if is_causal and query.size(-2) > 1:
        future = ~causal_mask(query.size(-2), key.size(-2), query.device)
        scores = scores.masked_fill(future, torch.finfo(scores.dtype).min)
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    output = torch.matmul(F.dropout(weights, p=dropout) if dropout > 0.0 else weights, value)
    return output, weights


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    is_causal: bool = False,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `"eager"` entry of transformers' attention interface: eq. 1 in plain torch, with weights.

    Same signature and layout as `transformers.integrations.sdpa_attention.sdpa_attention_forward`
    (which serves `"sdpa"`): query/key/value (batch, num_heads, len, head_dim) in, output
    (batch, tgt_len, num_heads, head_dim) and weights (batch, num_heads, tgt_len, src_len) out.
    """
    output, weights = scaled_dot_product_attention(
        query, key, value, attention_mask, is_causal=is_causal, scaling=scaling, dropout=dropout
    )
    return output.transpose(1, 2), weights  # (batch, tgt_len, num_heads, head_dim)


def attention_function(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, decoding: bool, output_attentions: bool = False
) -> Callable:
    """The function that computes eq. 1 for `module`, chosen as transformers' attention interface
    chooses it (as in Marian/BART): `"eager"` → `eager_attention_forward`, `"sdpa"` → torch's
    `F.scaled_dot_product_attention`, by `config._attn_implementation`.

    With `config.use_cpu_fast_paths` (the default) the fast paths may swap in a function with the
    same signature and results that runs faster on a CPU (`cpu_fast_paths.CPUFastPaths`).

    `output_attentions=True` needs the probabilities, which SDPA, flex and flash attention never
    materialise: such a call computes eq. 1 with `eager_attention_forward` (the same numbers, up to
    float rounding) and says so once, where transformers' own models warn and return no attentions.

    Args:
        module: the attention module (reads `config` and `training`).
        query: (batch, num_heads, q_len, head_dim); key: (batch, num_heads, kv_len, head_dim).
        decoding: a decoding step with a cache (one new position per decoder row).
        output_attentions: the caller returns the attention probabilities.
    """
    implementation = module.config._attn_implementation
    if output_attentions and implementation != "eager":
        logger.warning_once(
            f"output_attentions=True: attn_implementation={implementation!r} returns no attention probabilities, "
            f"so these calls compute them with the eager attention (load the model with "
            f'attn_implementation="eager" to skip this message)'
        )
        return eager_attention_forward
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
    fast = fast_paths(module.config)
    if fast is None:
        return interface
    return fast.attention_kernel(module, interface, eager_attention_forward, query, key, decoding)


def flex_block_mask(attention_mask: torch.Tensor | None, is_causal: bool, query: torch.Tensor, key: torch.Tensor):
    """The mask of eq. 1 as flex attention's `BlockMask` (`create_block_mask` over our boolean mask,
    the causal part folded in: flex attention takes no `is_causal`); None when nothing is masked.

    A `BlockMask` rather than a tensor of additive scores: transformers' score-mask route through
    torch 2.13's compiled CPU kernel corrupts memory (a plain (2, 1, 6, 6) mask aborts the process).

    Args:
        attention_mask: boolean, broadcastable to (batch, 1, q_len, kv_len), True where attending
            is allowed; or None.
        is_causal: also hide the keys after each query (aligned so that the last query sees every key).
        query: (batch, num_heads, q_len, head_dim); key: (batch, num_heads, kv_len, head_dim).
    """
    batch, q_len, kv_len = query.size(0), query.size(2), key.size(2)
    allowed = attention_mask
    if is_causal and q_len > 1:
        causal = causal_mask(q_len, kv_len, query.device)[None, None]
        allowed = causal if allowed is None else allowed & causal
    if allowed is None:
        return None
    # Read as a 2D table: indexing a 4D tensor inside mask_mod fails to compile on the CPU
    # (torch 2.13's inductor: an undeclared `cur_kvSplitSize` in the generated C++).
    table = allowed.expand(batch, 1, q_len, kv_len).reshape(batch, q_len * kv_len)

    def mask_mod(batch_idx, head_idx, q_idx, kv_idx):
        return table[batch_idx, q_idx * kv_len + kv_idx]

    return create_block_mask(mask_mod, B=batch, H=None, Q_LEN=q_len, KV_LEN=kv_len, device=query.device)


# --------------------------------------------------------------------------------------------
# §3.2.2 Multi-head attention
# --------------------------------------------------------------------------------------------


def project(hidden_states: torch.Tensor, projections: tuple[nn.Module, ...], config, scope=None) -> torch.Tensor:
    """The outputs of several projections of the same input side by side, [p_1(x); p_2(x); ...].

    The reference calls each layer (`q_proj(x)`, `k_proj(x)`, ...), so a layer that peft wrapped,
    `quantize_dynamic` replaced or a hook watches does its own work. With the CPU fast paths, plain
    `nn.Linear` layers run as one matrix multiply instead (`cpu_fast_paths.fused_projection`).

    Args:
        hidden_states: (batch, len, d_model), or (tokens, d_model).
        projections: layers d_model → d_model.
        config: the model config (`use_cpu_fast_paths`).
        scope: the decoding cache of a `generate()` run, or None.

    Returns:
        (..., len(projections) · d_model).
    """
    fast = fast_paths(config)
    fused = fast.fused_projection(hidden_states, projections, scope) if fast is not None else None
    if fused is not None:
        return fused
    return torch.cat([p(hidden_states) for p in projections], dim=-1)


class TransformerSeq2SeqAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
    (Vaswani et al. 2017, §3.2.2).

    All heads are projected at once: W^Q (d_model × d_model) holds the h blocks W_i^Q side by
    side, and the result is viewed as (batch, num_heads, len, head_dim); no loop over heads.

    Parameters are named as in Marian/BART: `q_proj` (W^Q), `k_proj` (W^K), `v_proj` (W^V),
    `out_proj` (W^O). Projections that read the same input are computed together (`project`): Q, K
    and V in self-attention, K and V of the encoder output in cross-attention, which is projected
    once per source.

    Args:
        config: the model config (`d_model`, `attention_dropout`).
        num_heads: h.
        is_causal: decoder self-attention (each position sees only earlier ones).
        is_cross_attention: keys and values come from the encoder (`key_value_states`).
        layer_idx: the decoder layer's index in the cache.
    """

    def __init__(
        self,
        config: TransformerSeq2SeqConfig,
        num_heads: int,
        is_causal: bool = False,
        is_cross_attention: bool = False,
        layer_idx: int | None = None,
    ):
        super().__init__()
        self.config = config
        self.d_model = config.d_model
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = is_causal
        self.is_cross_attention = is_cross_attention
        self.layer_idx = layer_idx
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.k_proj = nn.Linear(config.d_model, config.d_model)
        self.v_proj = nn.Linear(config.d_model, config.d_model)
        self.out_proj = nn.Linear(config.d_model, config.d_model)

    def _split_heads(self, states: torch.Tensor, parts: int) -> tuple[torch.Tensor, ...]:
        """(batch, len, parts·d_model) → `parts` views of (batch, num_heads, len, head_dim)."""
        batch, length, _ = states.shape
        states = states.view(batch, length, parts, self.num_heads, self.head_dim)
        return states.permute(2, 0, 3, 1, 4).unbind(0)  # parts × (batch, num_heads, len, head_dim)

    def _key_value(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None,
        cache: Cache | None,
        layout: PaddingFreeLayout | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """Query, key and value (batch, num_heads, len, head_dim), reading and filling the cache."""
        if not self.is_cross_attention:
            states = project(hidden_states, (self.q_proj, self.k_proj, self.v_proj), self.config, scope=cache)
            if layout is not None:  # (tokens, 3·d_model) → (batch, src_len, 3·d_model)
                states = layout.pad(states)
            query, key, value = self._split_heads(states, 3)
            if cache is not None:
                self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
                key, value = self_cache.update(key, value, self.layer_idx)  # grows by tgt_len each step
            return query, key, value

        (query,) = self._split_heads(self.q_proj(hidden_states), 1)
        cross_cache = cache.cross_attention_cache if isinstance(cache, EncoderDecoderCache) else None
        if cross_cache is not None and cache.is_updated.get(self.layer_idx, False):
            # The encoder output is fixed during decoding: its keys/values were projected once.
            layer = cross_cache.layers[self.layer_idx]
            return query, layer.keys, layer.values
        key, value = self._split_heads(project(key_value_states, (self.k_proj, self.v_proj), self.config), 2)
        if cross_cache is not None:
            key, value = cross_cache.update(key, value, self.layer_idx)
            cache.is_updated[self.layer_idx] = True
        return query, key, value

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        is_causal: bool | None = None,
        layout: PaddingFreeLayout | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from `hidden_states` to itself (self-attention) or to `key_value_states`.

        Args:
            hidden_states: (batch, tgt_len, d_model) queries (and keys/values for self-attention),
                or (tokens, d_model), the real tokens of a padded batch, with `layout`.
            key_value_states: (batch, src_len, d_model) encoder output, cross-attention only.
            attention_mask: boolean, broadcastable to (batch, num_heads, tgt_len, src_len), True
                where attending is allowed; None attends everywhere (or causally, see below).
            cache: `EncoderDecoderCache` (or a `DynamicCache` for self-attention only).
            is_causal: add the causal mask; defaults to the module's `is_causal`. The decoder
                passes False whenever it folds causality into an explicit `attention_mask` (SDPA
                takes one or the other).
            layout: self-attention over padding-free `hidden_states` (the encoder at inference):
                Q, K, V are projected for the real tokens only and scattered into the padded
                layout for eq. 1; the output comes back as (tokens, d_model).
            output_attentions: return the attention probabilities (computed by the eager attention
                whatever `attn_implementation` is, see `attention_function`).

        Returns:
            (output, weights): output (batch, tgt_len, d_model) (or (tokens, d_model)); weights
            (batch, num_heads, tgt_len, src_len) under attn_implementation="eager" or with
            `output_attentions`, else None.
        """
        batch, tgt_len = (layout.batch, layout.src_len) if layout is not None else hidden_states.shape[:2]
        # Projections: Q, K, V (batch, num_heads, len, head_dim), the cache read and filled
        query, key, value = self._key_value(hidden_states, key_value_states, cache, layout)
        query, group = self._stack_beams(query, sources=key.size(0))
        # Eq. 1, through the attention interface
        decoding = cache is not None and tgt_len == 1
        attention = attention_function(self, query, key, decoding=decoding, output_attentions=output_attentions)
        is_causal = self.is_causal if is_causal is None else is_causal
        if attention is flex_attention_forward and not isinstance(attention_mask, BlockMask):
            attention_mask, is_causal = flex_block_mask(attention_mask, is_causal, query, key), False
        output, weights = attention(
            self,
            query,
            key,
            value,
            attention_mask,
            scaling=self.scaling,
            dropout=self.attention_dropout if self.training else 0.0,
            is_causal=is_causal,
        )
        # Concat(head_1, ..., head_h) W^O
        output = output.reshape(batch, tgt_len, self.d_model)
        if layout is not None:
            output = layout.unpad(output)  # (tokens, d_model)
        if group > 1 and weights is not None:
            weights = weights.unflatten(2, (group, tgt_len)).transpose(1, 2).flatten(0, 1)
            # (batch, num_heads, tgt_len, src_len)
        return self.out_proj(output), weights

    @staticmethod
    def _stack_beams(query: torch.Tensor, sources: int) -> tuple[torch.Tensor, int]:
        """Stack the queries of the `group` consecutive decoder rows that share one source (the
        beams of a beam search, see `_expand_inputs_for_generation`), so that each source's keys
        and values are projected, cached and read once, not once per beam.

        (batch, num_heads, tgt_len, head_dim) → ((sources, num_heads, group·tgt_len, head_dim), group).

        Raises:
            ValueError: batch is not a multiple of `sources`.
        """
        batch = query.size(0)
        group = batch // sources
        if group * sources != batch:
            raise ValueError(f"{batch} decoder rows cannot be split evenly over {sources} sources")
        if group > 1:
            query = query.unflatten(0, (sources, group)).transpose(1, 2).flatten(2, 3)
        return query, group


# --------------------------------------------------------------------------------------------
# §3.3 Position-wise feed-forward network (eq. 2)
# --------------------------------------------------------------------------------------------


class TransformerSeq2SeqFeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2  (Vaswani et al. 2017, eq. 2).

    `fc1` is (W_1, b_1): d_model → d_ff, `fc2` is (W_2, b_2): d_ff → d_model. With
    `activation_function="gelu"`, GELU replaces max(0, ·) (Hendrycks & Gimpel 2016; not the paper).
    `activation_dropout` (not in the paper) drops units of the inner layer.
    """

    def __init__(self, config: TransformerSeq2SeqConfig, ffn_dim: int):
        super().__init__()
        self.config = config
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation = F.relu if config.activation_function == "relu" else F.gelu
        self.activation_dropout = config.activation_dropout

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(batch, len, d_model) → (batch, len, d_model)."""
        hidden_states = self.activation(self.fc1(hidden_states))  # (batch, len, ffn_dim)
        hidden_states = dropout(hidden_states, self.activation_dropout, self.training, self.config)
        return self.fc2(hidden_states)


# --------------------------------------------------------------------------------------------
# §3.4 Embeddings and §3.5 positional encoding
# --------------------------------------------------------------------------------------------


def sinusoidal_position_encoding(num_positions: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))
    (Vaswani et al. 2017, §3.5).

    Interleaved exactly as written in the paper (Marian/fairseq put all sines first, a permutation
    of the same features). Computed in float64, returned as float32; callers cast it to the
    model's dtype (a bfloat16 table keeps ~3 significant digits of each value, as transformers'
    own sinusoidal models have it).

    Returns:
        (num_positions, d_model), row `pos` the encoding of position `pos` (0-based).
    """
    position = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (num_positions, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d_model / 2),)
    angle = position / 10000.0 ** (two_i / d_model)  # (num_positions, ceil(d_model / 2))
    encoding = torch.zeros(num_positions, d_model, dtype=torch.float64)
    encoding[:, 0::2] = torch.sin(angle)
    encoding[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return encoding.float()


class TransformerSeq2SeqPositionalEmbedding(nn.Module):
    """Position vectors added to the token embeddings: the fixed sinusoids of §3.5, or a learned
    (max_position_embeddings, d_model) table (the paper's Table 3 row E variant).

    The sinusoidal table is a non-persistent buffer: it is rebuilt at initialisation, never saved,
    and follows the model's dtype like the parameters (`.to(dtype)`, `.half()`, loading with
    `dtype=`).
    """

    def __init__(self, config: TransformerSeq2SeqConfig):
        super().__init__()
        self.learned = config.position_embedding_type == "learned"
        self.max_positions = config.max_position_embeddings
        self.d_model = config.d_model
        if self.learned:
            self.weight = nn.Parameter(torch.empty(config.max_position_embeddings, config.d_model))
        else:
            table = sinusoidal_position_encoding(config.max_position_embeddings, config.d_model)
            # The default dtype at construction: from_pretrained(dtype=...) builds the model under it.
            self.register_buffer("weight", table.to(torch.get_default_dtype()), persistent=False)

    def forward(self, seq_len: int, past_length: int | torch.Tensor = 0) -> torch.Tensor:
        """Rows `past_length` .. `past_length + seq_len - 1`: (seq_len, d_model), a view; or a gather
        when `past_length` is a 0-dim tensor (a static cache's length, read without leaving a
        compiled graph).

        Raises:
            ValueError: the positions run past `max_position_embeddings` (checked outside compiled code).
        """
        if isinstance(past_length, torch.Tensor):
            if not torch.compiler.is_compiling():
                self.forward(seq_len, int(past_length))  # the length check
            positions = torch.arange(seq_len, device=self.weight.device) + past_length.to(self.weight.device)
            return self.weight.index_select(0, positions)
        end = past_length + seq_len
        if end > self.max_positions:
            raise ValueError(
                f"sequence of {end} tokens is longer than max_position_embeddings={self.max_positions}; "
                f"truncate the input (or generate fewer tokens), or build the model with a larger "
                f"max_position_embeddings"
            )
        return self.weight[past_length:end]


def unit_rows(weight: torch.Tensor) -> torch.Tensor:
    """Each row of `weight` (..., d_model) scaled to unit L2 length (FixNorm, Nguyen & Chiang 2018).

    A zero row (the padding embedding) stays zero and gets no gradient, where `F.normalize` would
    divide it by its eps and send ~1e12 times the gradient into it. The length is taken in float32,
    so float16 weights do not round the guard to 0 (0/0 = NaN); the result has `weight`'s dtype.
    """
    compute_dtype = torch.promote_types(weight.dtype, torch.float32)  # float16/bf16 → float32; float64 stays
    norm = torch.linalg.vector_norm(weight, dim=-1, keepdim=True, dtype=compute_dtype)
    scaled = (weight.to(compute_dtype) / norm.clamp_min(torch.finfo(compute_dtype).tiny)).to(weight.dtype)
    return torch.where(norm > 0, scaled, torch.zeros_like(scaled))


class TransformerSeq2SeqScaledEmbedding(nn.Embedding):
    """Token embeddings multiplied by √d_model (Vaswani et al. 2017, §3.4: "In the embedding layers,
    we multiply those weights by √d_model"), or by 1 when `scale_embedding=False`; with `fix_norm`
    each embedding is first scaled to unit length (`unit_rows`).

    A plain `nn.Embedding` underneath, so it can be shared between encoder and decoder and tied to
    `lm_head` (which uses the unscaled weight, as in the paper).
    """

    def __init__(self, config: TransformerSeq2SeqConfig):
        super().__init__(config.vocab_size, config.d_model, padding_idx=config.pad_token_id)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.fix_norm = config.fix_norm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(batch, len) ids → (batch, len, d_model); with `fix_norm` each embedding first scaled
        to unit L2 length (FixNorm, Nguyen & Chiang 2018)."""
        embeddings = super().forward(input_ids)
        if self.fix_norm:
            embeddings = unit_rows(embeddings)
        return embeddings * self.embed_scale


class ScaleNorm(nn.Module):
    """ScaleNorm(x) = g · x / max(||x||_2, eps), one learned scalar g (Nguyen & Salazar 2019,
    "Transformers without Tears", §2): projects each vector onto the sphere of radius g
    instead of standardising each feature as LayerNorm does. g starts at √d_model, the length a
    LayerNorm output of unit-variance features has.

    Shapes: (..., d_model) → (..., d_model). `weight` is g, shape (1,).
    """

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.d_model = d_model
        self.eps = eps
        self.weight = nn.Parameter(torch.full((1,), math.sqrt(d_model)))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        norm = torch.linalg.vector_norm(hidden_states, dim=-1, keepdim=True).clamp_min(self.eps)
        return hidden_states * (self.weight / norm)


def norm_layer(config: TransformerSeq2SeqConfig) -> nn.Module:
    """The normalisation every residual block and stack uses: `nn.LayerNorm` (the paper, §3.1)
    or `ScaleNorm` (`config.norm_type`)."""
    if config.norm_type == "scale_norm":
        return ScaleNorm(config.d_model, eps=config.layer_norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)


# --------------------------------------------------------------------------------------------
# §3.1 Encoder and decoder layers
# --------------------------------------------------------------------------------------------


class TransformerSeq2SeqLayer(GradientCheckpointingLayer):
    """What the encoder and decoder layers share: each sublayer wrapped in a residual connection
    (`residual`), post-norm as in the paper or pre-norm (`config.norm_order`)."""

    def __init__(self, config: TransformerSeq2SeqConfig):
        super().__init__()
        self.config = config
        self.pre_norm = config.norm_order == "pre"
        self.dropout = config.dropout

    def residual(self, norm: nn.Module, sublayer: Callable, hidden_states: torch.Tensor, **kwargs):
        """One sublayer in its residual connection (§3.1, §5.4): Norm(x + Dropout(Sublayer(x)))
        (post-norm, the paper) or x + Dropout(Sublayer(Norm(x))) (pre-norm, Wang et al. 2019);
        Norm is LayerNorm or ScaleNorm (`norm_layer`).

        Args:
            norm: this sublayer's normalisation.
            sublayer: called as `sublayer(x, **kwargs)`; returns the output, or (output, attention
                weights) for an attention.
            hidden_states: x, (batch, len, d_model) or (tokens, d_model).

        Returns:
            (the new x, the sublayer's attention weights or None).
        """
        output = sublayer(norm(hidden_states) if self.pre_norm else hidden_states, **kwargs)
        output, weights = output if isinstance(output, tuple) else (output, None)
        hidden_states = hidden_states + dropout(output, self.dropout, self.training, self.config)
        return (hidden_states if self.pre_norm else norm(hidden_states)), weights


class TransformerSeq2SeqEncoderLayer(TransformerSeq2SeqLayer):
    """One encoder layer: self-attention, then the feed-forward network (§3.1), each in its residual
    connection (`residual`)."""

    def __init__(self, config: TransformerSeq2SeqConfig):
        super().__init__(config)
        self.self_attn = TransformerSeq2SeqAttention(config, config.encoder_attention_heads)
        self.self_attn_layer_norm = norm_layer(config)
        self.feed_forward = TransformerSeq2SeqFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = norm_layer(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        layout: PaddingFreeLayout | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states (batch, src_len, d_model), attention_mask (batch, 1, 1, src_len) boolean →
        (hidden_states (batch, src_len, d_model), self-attention weights or None). With `layout`,
        hidden_states in and out are the real tokens only, (tokens, d_model)."""
        hidden_states, weights = self.residual(
            self.self_attn_layer_norm,
            self.self_attn,
            hidden_states,
            attention_mask=attention_mask,
            layout=layout,
            output_attentions=output_attentions,
        )
        hidden_states, _ = self.residual(self.final_layer_norm, self.feed_forward, hidden_states)
        return hidden_states, weights


class TransformerSeq2SeqDecoderLayer(TransformerSeq2SeqLayer):
    """One decoder layer: masked self-attention, cross-attention over the encoder output
    ("encoder-decoder attention", §3.2.3), then the feed-forward network, each in its residual
    connection (`residual`).
    """

    def __init__(self, config: TransformerSeq2SeqConfig, layer_idx: int):
        super().__init__(config)
        heads = config.decoder_attention_heads
        self.self_attn = TransformerSeq2SeqAttention(config, heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = norm_layer(config)
        self.encoder_attn = TransformerSeq2SeqAttention(config, heads, is_cross_attention=True, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = norm_layer(config)
        self.feed_forward = TransformerSeq2SeqFeedForward(config, config.decoder_ffn_dim)
        self.final_layer_norm = norm_layer(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        self_attention_mask: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        is_causal: bool = True,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """hidden_states (batch, tgt_len, d_model), encoder_hidden_states (batch, src_len, d_model),
        boolean masks broadcastable to (batch, num_heads, tgt_len, tgt_len + past) and
        (batch, num_heads, tgt_len, src_len) → (hidden_states, self-attention weights,
        cross-attention weights); weights are None unless attn_implementation="eager" or
        `output_attentions`."""
        hidden_states, self_weights = self.residual(
            self.self_attn_layer_norm,
            self.self_attn,
            hidden_states,
            attention_mask=self_attention_mask,
            cache=cache,
            is_causal=is_causal,
            output_attentions=output_attentions,
        )
        hidden_states, cross_weights = self.residual(
            self.encoder_attn_layer_norm,
            self.encoder_attn,
            hidden_states,
            key_value_states=encoder_hidden_states,
            attention_mask=encoder_attention_mask,
            cache=cache,
            output_attentions=output_attentions,
        )
        hidden_states, _ = self.residual(self.final_layer_norm, self.feed_forward, hidden_states)
        return hidden_states, self_weights, cross_weights


# --------------------------------------------------------------------------------------------
# transformers plumbing: base class, initialisation
# --------------------------------------------------------------------------------------------


def tied_weights_keys(config: TransformerSeq2SeqConfig, with_lm_head: bool) -> dict[str, str]:
    """The parameters that are one tensor, as transformers v5 wants them: {target: source}, named from
    `TransformerSeq2SeqModel`, or from the ForConditionalGeneration model (`model.` prefixed) with
    `lm_head`.

    With `share_encoder_decoder_embeddings` (§3.4) both stacks' `embed_tokens` are the module
    `shared`, whose weight `save_pretrained` writes once; `lm_head` follows `shared` then, else the
    decoder's embeddings. transformers ties `lm_head` only when `tie_word_embeddings=True`; the
    encoder/decoder sharing does not depend on it, because the embedding is one module.
    """
    prefix = "model." if with_lm_head else ""
    keys = {}
    if config.share_encoder_decoder_embeddings:
        keys = {f"{prefix}{stack}.embed_tokens.weight": f"{prefix}shared.weight" for stack in ("encoder", "decoder")}
    if with_lm_head:
        source = "shared" if config.share_encoder_decoder_embeddings else "decoder.embed_tokens"
        keys["lm_head.weight"] = f"model.{source}.weight"
    return keys


def check_source_rows(attention_mask: torch.Tensor | None) -> None:
    """Raise `ValueError` naming the rows of a (batch, src_len) source `attention_mask` that are all 0.

    Such a row has no key to attend to: SDPA would return its output silently, and eager attention
    would spread the row's weights uniformly over its padding. The RNN encoder refuses the same rows
    (it cannot pack a sequence of length 0).
    """
    if attention_mask is None:
        return
    empty = ~attention_mask.bool().any(dim=-1)  # (batch,)
    if bool(empty.any()):
        rows = empty.nonzero().flatten().tolist()
        raise ValueError(f"attention_mask row(s) {rows} are all 0: every source sentence needs at least one real token")


class TransformerSeq2SeqPreTrainedModel(Seq2SeqSavingMixin, PreTrainedModel):
    """Weight initialisation and transformers capabilities shared by the Transformer models.

    Initialisation (the paper does not state one; this follows the reference tensor2tensor/fairseq
    setup): Xavier-uniform linear weights, zero biases, token and learned position embeddings
    ~ N(0, init_std²) with init_std = d_model^-0.5 by default (unit variance after the √d_model scaling), \
the padding row
    zero, LayerNorms at (1, 0), ScaleNorm gains g at √d_model.
    """

    config_class = TransformerSeq2SeqConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    # The masks are boolean (batch, 1, tgt_len, kv_len) tensors, the layout eager and SDPA take; flex
    # attention gets them as a BlockMask (`flex_block_mask`). Flash attention wants 2D padding masks
    # and equal query/key batches, which beam search's one cross-attention copy per source does not
    # have: not claimed, so from_pretrained refuses it in one line.
    _supports_flash_attn = False
    _supports_flex_attn = True
    # A decoding step with a static cache has fixed shapes and no data-dependent branch: generate() may
    # compile it (cache_implementation="static", a CompileConfig; on a CPU `_compile_all_devices=True`).
    _can_compile_fullgraph = True
    _no_split_modules = ["TransformerSeq2SeqEncoderLayer", "TransformerSeq2SeqDecoderLayer"]

    def mark_tied_weights_as_initialized(self, loading_info) -> None:
        """transformers' loading step that flags tied parameters as loaded, keeping a missing shared
        embedding reported as missing.

        The encoder and decoder share one embedding module (`shared`), not only a parameter. For
        custom-code models transformers drops from the missing keys every parameter that this step
        flagged, and flagging a tied target flags the very object `shared.weight` is: a checkpoint
        without the embedding would then load with no missing key reported and `shared.weight` left
        on the meta device. Sources that were missing stay missing, so they are initialised and
        reported (as Marian's are)."""
        missing_before = set(loading_info.missing_keys)
        super().mark_tied_weights_as_initialized(loading_info)
        sources = set(getattr(self, "all_tied_weights_keys", {}).values())
        loading_info.missing_keys = set(loading_info.missing_keys) | (sources & missing_before)

    def _init_weights(self, module: nn.Module) -> None:
        d_model = self.config.d_model
        std = self.config.init_std if self.config.init_std is not None else d_model**-0.5
        if isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, TransformerSeq2SeqPositionalEmbedding):
            if module.learned:
                init.normal_(module.weight, mean=0.0, std=std)
            else:
                init.copy_(module.weight, sinusoidal_position_encoding(module.max_positions, module.d_model))
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, ScaleNorm):
            init.constant_(module.weight, math.sqrt(module.d_model))
        if isinstance(module, nn.Linear) and module.bias is not None:
            init.zeros_(module.bias)


# --------------------------------------------------------------------------------------------
# The two stacks
# --------------------------------------------------------------------------------------------


class TransformerSeq2SeqEncoder(nn.Module):
    """N encoder layers over scaled token embeddings plus positions (§3.1, §3.4, §3.5); with
    `norm_order="pre"` a final norm (`norm_layer`) normalises the stack's output."""

    def __init__(self, config: TransformerSeq2SeqConfig, embed_tokens: nn.Embedding):
        super().__init__()
        self.config = config
        self.dropout = config.dropout
        self.embed_tokens = embed_tokens
        self.embed_positions = TransformerSeq2SeqPositionalEmbedding(config)
        self.layers = nn.ModuleList(TransformerSeq2SeqEncoderLayer(config) for _ in range(config.encoder_layers))
        pre_norm = config.norm_order == "pre"
        self.layer_norm = norm_layer(config) if pre_norm else None

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> BaseModelOutput | tuple:
        """Encode a source batch.

        Args:
            input_ids: (batch, src_len) source ids.
            attention_mask: (batch, src_len), 1 for tokens and 0 for padding; None: no padding.
            output_attentions: also return each layer's self-attention probabilities,
                (batch, num_heads, src_len, src_len) per layer (computed by the eager attention).
            output_hidden_states: also return the embedding output and each layer's output.

        Returns:
            `BaseModelOutput`: last_hidden_state (batch, src_len, d_model), hidden_states
            (num_layers + 1 tensors), attentions (num_layers tensors). In eval mode with the CPU
            fast paths, without hidden states or attentions asked for, padded positions skip every
            layer (`PaddingFreeLayout`) and hold zeros in last_hidden_state; the real tokens' states
            are the same either way (up to float rounding).

        Raises:
            ValueError: the source is longer than `max_position_embeddings`, a row of
                `attention_mask` is all 0 (naming the rows).
        """
        config = self.config
        output_attentions = config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
        check_source_rows(attention_mask)

        embeddings = self.embed_tokens(input_ids)
        hidden_states = embeddings + self.embed_positions(input_ids.size(1)).to(embeddings.dtype)
        hidden_states = dropout(hidden_states, self.dropout, self.training, self.config)
        mask = attention_mask.bool()[:, None, None, :] if attention_mask is not None else None  # (batch, 1, 1, src_len)
        fast = fast_paths(config)
        layout = None
        if fast and not self.training and not (output_hidden_states or output_attentions):
            # Inference: every position-wise layer runs on the real tokens only (see PaddingFreeLayout).
            layout = fast.padding_free_layout(attention_mask)
        if layout is not None:
            hidden_states = layout.unpad(hidden_states)  # (tokens, d_model)

        all_hidden_states = () if output_hidden_states else None
        all_attentions = () if output_attentions else None
        for layer in self.layers:
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            hidden_states, weights = layer(hidden_states, mask, layout=layout, output_attentions=output_attentions)
            if output_attentions:
                all_attentions += (weights,)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        if layout is not None:
            hidden_states = layout.pad(hidden_states)  # (batch, src_len, d_model), zeros at padding
        if output_hidden_states:
            all_hidden_states += (hidden_states,)

        output = BaseModelOutput(
            last_hidden_state=hidden_states, hidden_states=all_hidden_states, attentions=all_attentions
        )
        return output if return_dict is not False else output.to_tuple()


class TransformerSeq2SeqDecoder(nn.Module):
    """N decoder layers over the shifted target (§3.1): masked self-attention, cross-attention to
    the encoder output, feed-forward; with `norm_order="pre"` a final norm (`norm_layer`)."""

    def __init__(self, config: TransformerSeq2SeqConfig, embed_tokens: nn.Embedding):
        super().__init__()
        self.config = config
        self.dropout = config.dropout
        self.embed_tokens = embed_tokens
        self.embed_positions = TransformerSeq2SeqPositionalEmbedding(config)
        self.layers = nn.ModuleList(
            TransformerSeq2SeqDecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)
        )
        pre_norm = config.norm_order == "pre"
        self.layer_norm = norm_layer(config) if pre_norm else None

    @staticmethod
    def _self_attention_mask(
        attention_mask: torch.Tensor | None, tgt_len: int, past_length: int, device: torch.device
    ) -> tuple[torch.Tensor | None, bool]:
        """(mask, is_causal) for the decoder self-attention.

        Without padding and without cached positions the mask is None and `is_causal=True`, which
        lets SDPA use its fused causal kernels; a single new query after cached ones needs no mask
        at all. Otherwise a boolean (batch | 1, 1, tgt_len, past_length + tgt_len) mask.
        """
        if attention_mask is None and (past_length == 0 or tgt_len == 1):
            return None, past_length == 0
        kv_len = past_length + tgt_len
        mask = causal_mask(tgt_len, kv_len, device)[None, None]  # (1, 1, tgt_len, kv_len)
        if attention_mask is not None:
            mask = mask & attention_mask.bool()[:, None, None, -kv_len:]  # (batch, 1, tgt_len, kv_len)
        return mask, False

    @staticmethod
    def _fixed_size_cache_mask(
        attention_mask: torch.Tensor | None, tgt_len: int, past_length: int | torch.Tensor, cache: Cache
    ) -> torch.Tensor:
        """Boolean self-attention mask over a static cache, whose keys are always `max_cache_len` long
        (the unwritten positions hold zeros): (1 | batch, 1, tgt_len, max_cache_len), True where
        query i (at position past_length + i) may attend key j, i.e. j ≤ past_length + i.

        `attention_mask` may be the 4D mask `generate` builds for compileable caches (boolean,
        True = attend, or additive floats, 0 = attend), used as it is, or a 2D (batch, past_length
        + tgt_len) padding mask.
        """
        if attention_mask is not None and attention_mask.dim() == 4:
            return attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        kv_len = cache.get_max_cache_shape()
        device = cache.layers[0].keys.device if cache.layers[0].is_initialized else None
        keys = torch.arange(kv_len, device=device)
        queries = torch.arange(tgt_len, device=device) + past_length
        mask = (keys[None, :] <= queries[:, None])[None, None]  # (1, 1, tgt_len, kv_len)
        if attention_mask is not None:  # (batch, past_length + tgt_len) → padded to kv_len with False
            padding = attention_mask.bool().new_zeros(attention_mask.size(0), kv_len - attention_mask.size(1))
            mask = mask & torch.cat([attention_mask.bool(), padding], dim=1)[:, None, None, :]
        return mask

    def forward(
        self,
        input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool = False,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> BaseModelOutputWithPastAndCrossAttentions | tuple:
        """Decode target positions (all at once in training; the new ones with a cache).

        Args:
            input_ids: (batch, tgt_len) decoder input ids (with a cache: only the new positions).
            encoder_hidden_states: (batch, src_len, d_model), or (batch / k, src_len, d_model)
                when k consecutive decoder rows share a source (beam search).
            encoder_attention_mask: (batch or batch / k, src_len), 1 for source tokens, 0 for padding.
            attention_mask: (batch, past_length + tgt_len) decoder padding mask. Not needed for
                right-padded targets: causality already hides later (padded) positions.
            cache: `EncoderDecoderCache` holding earlier positions' self-attention keys/values and
                the cross-attention keys/values; created when `use_cache` and None.
            use_cache: return the (grown) cache.
            output_attentions: also return self- and cross-attention probabilities per layer,
                (batch, num_heads, tgt_len, past_length + tgt_len) and (batch, num_heads, tgt_len,
                src_len).
            output_hidden_states: also return the embedding output and each layer's output.

        Returns:
            `BaseModelOutputWithPastAndCrossAttentions` (last_hidden_state (batch, tgt_len,
            d_model), cache, hidden_states, attentions, cross_attentions).

        Raises:
            ValueError: past_length + tgt_len exceeds `max_position_embeddings`.
        """
        config = self.config
        output_attentions = config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
        past_length = cache.get_seq_length() if cache is not None else 0
        tgt_len = input_ids.size(1)
        self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache

        embeddings = self.embed_tokens(input_ids)
        hidden_states = embeddings + self.embed_positions(tgt_len, past_length).to(embeddings.dtype)
        hidden_states = dropout(hidden_states, self.dropout, self.training, self.config)
        if self_cache is not None and self_cache.is_compileable:  # a static cache: keys of its full length
            self_mask, is_causal = self._fixed_size_cache_mask(attention_mask, tgt_len, past_length, self_cache), False
        else:
            self_mask, is_causal = self._self_attention_mask(attention_mask, tgt_len, past_length, input_ids.device)
        cross_mask = encoder_attention_mask.bool()[:, None, None, :] if encoder_attention_mask is not None else None

        all_hidden_states = () if output_hidden_states else None
        all_self_attentions = () if output_attentions else None
        all_cross_attentions = () if output_attentions else None
        for layer in self.layers:
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            hidden_states, self_weights, cross_weights = layer(
                hidden_states,
                encoder_hidden_states,  # positional: reentrant gradient checkpointing needs it so
                self_mask,
                cross_mask,
                cache=cache,
                is_causal=is_causal,
                output_attentions=output_attentions,
            )
            if output_attentions:
                all_self_attentions += (self_weights,)
                all_cross_attentions += (cross_weights,)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        if output_hidden_states:
            all_hidden_states += (hidden_states,)

        output = BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states,
            cache=cache if use_cache else None,
            hidden_states=all_hidden_states,
            attentions=all_self_attentions,
            cross_attentions=all_cross_attentions,
        )
        return output if return_dict is not False else output.to_tuple()


# --------------------------------------------------------------------------------------------
# transformers models
# --------------------------------------------------------------------------------------------


class TransformerSeq2SeqModel(Seq2SeqModelMixin, TransformerSeq2SeqPreTrainedModel):
    """The encoder-decoder without an output layer: returns the decoder's last hidden states.

    With `share_encoder_decoder_embeddings` (§3.4, a joint vocabulary) `shared`, `encoder.embed_tokens`
    and `decoder.embed_tokens` are one module.
    """

    def __init__(self, config: TransformerSeq2SeqConfig):
        super().__init__(config)
        self._tied_weights_keys = tied_weights_keys(config, with_lm_head=False)
        if config.share_encoder_decoder_embeddings:
            self.shared = TransformerSeq2SeqScaledEmbedding(config)
            encoder_embed_tokens = decoder_embed_tokens = self.shared
        else:
            encoder_embed_tokens = TransformerSeq2SeqScaledEmbedding(config)
            decoder_embed_tokens = TransformerSeq2SeqScaledEmbedding(config)
        self.encoder = TransformerSeq2SeqEncoder(config, encoder_embed_tokens)
        self.decoder = TransformerSeq2SeqDecoder(config, decoder_embed_tokens)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.encoder.embed_tokens = value
        if self.config.share_encoder_decoder_embeddings:
            self.shared = self.decoder.embed_tokens = value

    def encoder_outputs_from_tuple(self, outputs: tuple) -> BaseModelOutput:
        """(last_hidden_state[, hidden_states[, attentions]]), as `BaseModelOutput.to_tuple()` gives them."""
        return BaseModelOutput(*outputs)

    def decode(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_outputs: BaseModelOutput,
        attention_mask: torch.Tensor | None,
        decoder_attention_mask: torch.Tensor | None,
        cache: Cache | None,
        **kwargs,
    ) -> Seq2SeqModelOutput:
        """The decoder over `encoder_outputs` (see `Seq2SeqModelMixin.forward`). The decoder batch may
        be k × the source batch: rows k·i .. k·i + k - 1 then all translate source i (how `generate`
        runs beams without copying the encoder output).

        Returns:
            `Seq2SeqModelOutput`: last_hidden_state (batch, tgt_len, d_model), cache,
            encoder_last_hidden_state (batch, src_len, d_model), and, when asked, per-layer
            decoder_attentions / cross_attentions / encoder_attentions (batch, num_heads, q_len,
            k_len) and hidden states.
        """
        decoder_outputs = self.decoder(
            decoder_input_ids,
            encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            attention_mask=decoder_attention_mask,
            cache=cache,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            **{f"encoder_{name}": value for name, value in encoder_outputs.items()},
        )


class TransformerSeq2SeqForConditionalGeneration(
    Seq2SeqLMMixin, TransformerSeq2SeqPreTrainedModel, Seq2SeqGenerationMixin
):
    """The Transformer translation model: `TransformerSeq2SeqModel` plus the output projection
    `lm_head` (the "learned linear transformation" before the softmax, §3.4), tied by default to
    the decoder's token embeddings.

    Generation defaults (in `generation_config`): beam search with 5 beams, at most 128 new tokens
    (fewer when `max_position_embeddings` is smaller: `Seq2SeqGenerationMixin`), starting from `<s>`
    (id 1) and stopping at `</s>` (id 2). A `max_length` passed to `generate()` beats the default
    `max_new_tokens`.
    """

    lm_output_class = Seq2SeqLMOutput

    def __init__(self, config: TransformerSeq2SeqConfig):
        super().__init__(config)
        self.model = TransformerSeq2SeqModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._tied_weights_keys = tied_weights_keys(config, with_lm_head=True)
        self.post_init()
        self.set_generation_defaults(config)

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
        # One `vocab_size` covers both sides: unshared decoder embeddings are resized as well
        # (transformers resizes only the input embeddings and `lm_head`).
        embeddings = super()._resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        if not self.config.share_encoder_decoder_embeddings:
            decoder = self.model.decoder
            decoder.embed_tokens = self._get_resized_embeddings(
                decoder.embed_tokens, embeddings.weight.shape[0], mean_resizing=mean_resizing
            )
        return embeddings

    def output_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The logits `lm_head(hidden_states)` (§3.4), or with `fix_norm` h · e_v / ||e_v||: each
        output embedding at unit length (FixNorm, Nguyen & Chiang 2018), renormalised at every call.

        A plain bias-free `nn.Linear` `lm_head` is normalised directly (`unit_rows`); any other layer
        (peft's LoRA, a quantized replacement) is called, and its outputs divided by the lengths of
        the embeddings it applies, read back by calling it on the identity matrix.

        Args:
            hidden_states: (batch, tgt_len, d_model) decoder output.

        Returns:
            (batch, tgt_len, vocab_size).
        """
        if not self.config.fix_norm:
            return self.lm_head(hidden_states)
        if plain_linears(self.lm_head) and self.lm_head.bias is None:
            return F.linear(hidden_states, unit_rows(self.lm_head.weight))
        identity = torch.eye(self.config.d_model, dtype=hidden_states.dtype, device=hidden_states.device)
        embeddings = self.lm_head(identity)  # (d_model, vocab_size): column v is e_v as the layer applies it
        norms = torch.linalg.vector_norm(embeddings, dim=0, dtype=torch.promote_types(embeddings.dtype, torch.float32))
        scale = torch.where(norms > 0, 1.0 / norms.clamp_min(torch.finfo(norms.dtype).tiny), 0.0)
        return self.lm_head(hidden_states) * scale.to(hidden_states.dtype)

    def _max_decoder_positions(self) -> int:
        return self.config.max_position_embeddings

    def _expand_inputs_for_generation(self, expand_size=1, is_encoder_decoder=False, input_ids=None, **model_kwargs):
        """Repeat the decoder-side inputs `expand_size` times (beams, returned sequences) but keep
        one copy of each source: `encoder_outputs` and the source `attention_mask` stay at
        (batch, ...). Cross-attention serves the `expand_size` consecutive decoder rows of a source
        from that one copy (see `TransformerSeq2SeqAttention.forward`), so its keys/values are
        projected and cached once per source instead of once per beam (transformers' default
        repeats the encoder output, as Marian/BART do).
        """
        encoder_outputs = model_kwargs.pop("encoder_outputs", None)
        attention_mask = model_kwargs.pop("attention_mask", None)
        input_ids, model_kwargs = super()._expand_inputs_for_generation(
            expand_size, is_encoder_decoder=False, input_ids=input_ids, **model_kwargs
        )
        if is_encoder_decoder and encoder_outputs is None:
            raise ValueError("generate() needs `encoder_outputs` for an encoder-decoder model")
        model_kwargs["encoder_outputs"] = encoder_outputs
        if attention_mask is not None:
            model_kwargs["attention_mask"] = attention_mask
        return input_ids, model_kwargs

    @staticmethod
    def _reorder_cache(cache: Cache, beam_idx: torch.Tensor) -> Cache:
        """Beam search: keep the self-attention keys/values of the surviving beams.

        The cross-attention cache holds one copy per source (see `_expand_inputs_for_generation`)
        and a beam only ever continues a beam of its own source, so it needs no reordering.
        """
        if isinstance(cache, EncoderDecoderCache):
            cache.self_attention_cache.reorder_cache(beam_idx)
        else:
            cache.reorder_cache(beam_idx)
        return cache


__all__ = [
    "TransformerSeq2SeqForConditionalGeneration",
    "TransformerSeq2SeqModel",
    "TransformerSeq2SeqPreTrainedModel",
]
