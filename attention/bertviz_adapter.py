"""bertviz's ``model_view`` / ``head_view`` for this package's encoder-decoder models.

bertviz (Vig 2019) draws encoder-decoder attention from three lists of per-layer tensors, each
of shape (batch = 1, num_heads, query_len, key_len), and the two token lists::

    from bertviz import model_view                      # pip install bertviz (not a dependency)
    from attention_seq2seq.attention.bertviz_adapter import bertviz_inputs
    from attention_seq2seq.translation.loading import load_for_inference

    loaded = load_for_inference("runs/multi30k", attn_implementation="eager")
    model_view(**bertviz_inputs(loaded.model, loaded.tokenizer, "Ein Hund läuft im Schnee."))

:func:`bertviz_inputs` returns exactly those keyword arguments, computed by the attention
explorer's :func:`~attention_seq2seq.attention.explorer.explain` (the model's own translation, or a
``target`` teacher-forced). The RNN has no self-attention: it gives ``cross_attention`` alone
(one layer, one head); a model with ``attention="none"`` has nothing to show and raises.
"""

from __future__ import annotations

import torch

from .explorer import explain


def bertviz_inputs(model, tokenizer, source: str, target: str | None = None, **explain_kwargs) -> dict:
    """Keyword arguments for ``bertviz.model_view`` and ``bertviz.head_view`` (encoder-decoder form).

    Args:
        model, tokenizer: an encoder-decoder of this package (a Transformer loaded with
            ``attn_implementation="eager"``) and its tokenizer.
        source: the source sentence.
        target: teacher-force this translation; default: the model's own (``explain_kwargs``,
            e.g. ``num_beams=5``, choose the decoding).

    Returns:
        ``{"cross_attention", "encoder_tokens", "decoder_tokens"}`` plus, for the Transformer,
        ``"encoder_attention"`` and ``"decoder_attention"``. Attention values are tuples with one
        float tensor per layer: encoder (1, num_heads, src_len, src_len), decoder (1, num_heads,
        tgt_len, tgt_len), cross (1, num_heads, tgt_len, src_len). ``decoder_tokens`` are the
        decoder's inputs (the start token, then the translation without its last token), the
        rows of decoder and cross-attention, as bertviz labels them.

    Raises:
        ValueError: the model has no attention (``attention="none"``), or ``source`` is empty.
    """
    e = explain(model, tokenizer, source, target=target, **explain_kwargs)
    if e.cross is None:
        raise ValueError("this model has attention='none': there is no attention for bertviz to show")

    def per_layer(array):
        return tuple(torch.from_numpy(layer).unsqueeze(0) for layer in array)  # (1, num_heads, q, k)

    inputs = {
        "cross_attention": per_layer(e.cross),
        "encoder_tokens": list(e.src_tokens),
        "decoder_tokens": list(e.decoder_tokens),
    }
    if e.encoder_self is not None:
        inputs["encoder_attention"] = per_layer(e.encoder_self)
    if e.decoder_self is not None:
        inputs["decoder_attention"] = per_layer(e.decoder_self)
    return inputs
