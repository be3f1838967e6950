"""One sentence's cross-attention for the ``plot-attention`` command, from the teacher-forced
attention pass (``modeling/attention_pass.py``: generate or take a reference, cut after ``</s>``,
teacher-force with ``output_attentions=True``)."""

from __future__ import annotations

from pathlib import Path

from ..common.errors import UserError
from .sentences import attention_pass


def sentence_attention(loaded, source: str, reference: str | None, generate_kwargs: dict):
    """Cross-attention of one sentence pair, by teacher forcing the reference or the model's output.

    Args:
        loaded: a loaded model (``translation.loading``: ``model``, ``tokenizer``, ``location``).
        source: the source sentence.
        reference: teacher-force this translation; None: the model's own (``generate_kwargs``).
        generate_kwargs: ``generate`` options for the model's own translation.

    Returns:
        ``(layers, src_tokens, tgt_tokens)`` with each layer's weights as a float32 numpy array
        ``(num_heads, tgt_len, src_len)``; row ``t`` is the attention while predicting
        ``tgt_tokens[t]``.

    Raises:
        UserError: the model returns no cross-attention (an RNN with ``attention="none"``).
    """
    sentence = attention_pass(
        loaded.model,
        loaded.tokenizer,
        [source],
        None if reference is None else [reference],
        generate_kwargs=generate_kwargs,
    ).sentences[0]
    if not sentence.cross:
        raise UserError(f"model {loaded.location.model_path} returned no cross-attention weights")
    layers = [layer.float().cpu().numpy() for layer in sentence.cross]  # (num_heads, tgt_len, src_len)
    return layers, sentence.source_tokens, sentence.target_tokens


def plot_sentence_attention(
    loaded, source: str, reference: str | None, generate_kwargs: dict, output: Path, *, per_head: bool = True
) -> list[Path]:
    """Draw one sentence's cross-attention (:func:`sentence_attention`) into ``output`` (a PNG)
    and, for the Transformer with ``per_head``, every head of each layer beside it
    (``<stem>_layer<L>_heads.png``); returns the files written.

    Raises:
        UserError: as :func:`sentence_attention`.
    """
    from .plotting import plot_cross_attentions

    layers, src_tokens, tgt_tokens = sentence_attention(loaded, source, reference, generate_kwargs)
    return plot_cross_attentions(layers, src_tokens, tgt_tokens, output.parent, output.stem, per_head=per_head)
