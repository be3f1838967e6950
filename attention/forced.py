"""The teacher-forced attention pass: generate (or take a reference), cut at ``</s>``, and read the
attention weights back by teacher forcing the target with ``output_attentions=True``."""

from __future__ import annotations

from ..errors import UserError


def sentence_attention(loaded, source: str, reference: str | None, generate_kwargs: dict):
    """Cross-attention of one sentence pair, by teacher forcing the reference or the model's output.

    Returns ``(layers, src_tokens, tgt_tokens)`` with each layer's weights as a numpy array
    ``(num_heads, tgt_len, src_len)``; row ``t`` is the attention while predicting ``tgt_tokens[t]``.
    """
    import torch

    model, tokenizer = loaded.model, loaded.tokenizer
    device = next(model.parameters()).device
    encoded = tokenizer([source], return_tensors="pt").to(device)
    with torch.inference_mode():
        if reference is not None:
            target_ids = tokenizer(text_target=[reference], return_tensors="pt")["input_ids"].to(device)
        else:
            generated = model.generate(**encoded, **generate_kwargs)[0]
            # Drop the decoder start token and any padding after </s>; keep </s> itself.
            ids = generated[1:].tolist()
            eos = model.generation_config.eos_token_id
            eos_ids = set(eos if isinstance(eos, list) else [eos])
            cut = next((i + 1 for i, t in enumerate(ids) if t in eos_ids), len(ids))
            target_ids = torch.tensor([ids[:cut]], device=device)
        outputs = model(
            input_ids=encoded["input_ids"],
            attention_mask=encoded["attention_mask"],
            labels=target_ids,
            output_attentions=True,
        )
    if not outputs.cross_attentions:
        raise UserError(f"model {loaded.location.model_path} returned no cross-attention weights")
    layers = [layer[0].float().cpu().numpy() for layer in outputs.cross_attentions]  # (num_heads, tgt_len, src_len)
    src_tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
    tgt_tokens = tokenizer.convert_ids_to_tokens(target_ids[0].tolist())
    return layers, src_tokens, tgt_tokens
