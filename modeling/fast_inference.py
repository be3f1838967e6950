"""Inference-only fast paths of the Transformer (`generate()`, evaluation), CPU float32.

- `packed_linear`: the output projection of a decoding step (64 rows × d_model 256 → vocabulary
  8,000) took 2.68 ms through `F.linear` and 1.24 ms through oneDNN's prepacked-weight GEMM here
  (2-core AMD EPYC, 2 threads; benchmarks/README.md, "What made translation faster"). The weight
  is packed once per `generate()` call (~1% of a 16-step greedy batch) and dropped with it.
- `PaddingFreeLayout`: the encoder's position-wise layers run on the real tokens only.

`packed_linear` applies only where autograd records nothing (`torch.no_grad()` /
`torch.inference_mode()`, which `generate()` uses), with a decoding cache, to float32 CPU tensors
outside autocast and `torch.compile`, with oneDNN enabled; everything else takes the plain
`F.linear` path. Results equal `F.linear`'s up to float32 rounding (tests/test_fast_inference.py).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn


class _PackedWeight:
    """A packed copy of one weight, valid for one decoding run: `scope` is a weak reference to the
    decoding cache of that `generate()` call (weights do not change while it runs)."""

    __slots__ = ("scope", "data_ptr", "packed")

    def __init__(self, weight: torch.Tensor, scope: object, packed: torch.Tensor | None):
        self.scope = weakref.ref(scope)
        self.data_ptr = weight.data_ptr()
        self.packed = packed  # None: packing failed, use F.linear

    def matches(self, weight: torch.Tensor, scope: object) -> bool:
        return self.scope() is scope and self.data_ptr == weight.data_ptr()


# Outside the modules, so deepcopy/pickling of a model never meets a packed (storage-less) tensor.
_PACKED: weakref.WeakKeyDictionary[nn.Linear, _PackedWeight] = weakref.WeakKeyDictionary()


def _packing_applies(hidden_states: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        not torch.is_grad_enabled()
        and hidden_states.device.type == "cpu"
        and weight.device.type == "cpu"
        and hidden_states.dtype == torch.float32
        and weight.dtype == torch.float32
        and hidden_states.numel() > 0
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def packed_linear(hidden_states: torch.Tensor, layer: nn.Linear, scope: object | None) -> torch.Tensor:
    """`layer(hidden_states)`, through a prepacked-weight oneDNN GEMM during one decoding run.

    Args:
        hidden_states: (..., in_features).
        layer: the Linear layer (e.g. `lm_head`, d_model → vocab_size).
        scope: the decoding cache of the running `generate()` call (the same object at every
            step). The weight is packed at the first step of a run and reused until the run ends;
            a new run (a new cache) packs again, so weights updated between runs (training,
            `load_state_dict`, `.data` writes) are always seen. None: plain `layer(hidden_states)`.

    Returns:
        (..., out_features), equal to `layer(hidden_states)` up to float32 rounding.
    """
    weight, bias = layer.weight, layer.bias
    if scope is None or not _packing_applies(hidden_states, weight):
        return layer(hidden_states)
    entry = _PACKED.get(layer)
    if entry is None or not entry.matches(weight, scope):
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        except RuntimeError:  # a build without this kernel
            packed = None
        entry = _PackedWeight(weight, scope, packed)
        _PACKED[layer] = entry
    if entry.packed is None:
        return layer(hidden_states)
    flat = hidden_states.reshape(-1, hidden_states.size(-1))
    try:
        output = torch.ops.mkldnn._linear_pointwise(flat, entry.packed, bias, "none", [], "")
    except RuntimeError:
        entry.packed = None
        return layer(hidden_states)
    return output.view(*hidden_states.shape[:-1], weight.size(0))


class PaddingFreeLayout:
    """The real (non-padding) tokens of a padded batch, for running position-wise work on them only.

    Encoding a batch at inference, every linear layer, LayerNorm and feed-forward network acts on
    each position independently, so they can run on the (tokens, d_model) matrix of real tokens
    instead of (batch · src_len, d_model): padding costs nothing there. Only self-attention needs
    the (batch, num_heads, src_len, head_dim) layout; it scatters its projected Q, K, V into it and
    gathers its output back (the "remove padding" of FasterTransformer's encoder, and the nested
    tensors of PyTorch's BetterTransformer fast path). On Multi30k test2016 in file order, batches of
    64, 53% of the padded source positions are padding.

    Args:
        attention_mask: (batch, src_len), 1 for tokens and 0 for padding.

    Attributes:
        index: (tokens,) positions of the real tokens in the flattened (batch · src_len) grid.
        batch, src_len: the padded shape.
    """

    def __init__(self, attention_mask: torch.Tensor):
        self.batch, self.src_len = attention_mask.shape
        self.index = attention_mask.reshape(-1).nonzero().squeeze(1)

    @staticmethod
    def worth_it(attention_mask: torch.Tensor | None) -> bool:
        """True when the mask hides any position (otherwise gathering would only cost time)."""
        return attention_mask is not None and not bool(attention_mask.all())

    def unpad(self, states: torch.Tensor) -> torch.Tensor:
        """(batch, src_len, features) → (tokens, features)."""
        return states.reshape(self.batch * self.src_len, -1).index_select(0, self.index)

    def pad(self, tokens: torch.Tensor) -> torch.Tensor:
        """(tokens, features) → (batch, src_len, features), zeros at padding."""
        padded = tokens.new_zeros(self.batch * self.src_len, tokens.size(-1))
        return padded.index_copy_(0, self.index, tokens).view(self.batch, self.src_len, -1)
