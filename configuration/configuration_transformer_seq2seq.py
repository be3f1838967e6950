"""Configuration of the Transformer encoder-decoder (Vaswani et al. 2017, "Attention Is All You Need").

The defaults are the paper's base model (Table 3, row "base"): 6 + 6 layers, d_model = 512, 8 heads,
d_ff = 2048, dropout 0.1, sinusoidal positions, post-norm residual blocks, shared source/target
embeddings tied to the output projection (§3.4), and the package's special-token ids
(pad 0, <s> 1 = decoder start, </s> 2, unk 3; see docs/DESIGN.md).
"""

from __future__ import annotations

from .configuration_checks import CheckedConfig, check_choice

POSITION_EMBEDDING_TYPES = ("sinusoidal", "learned")
NORM_ORDERS = ("post", "pre")
NORM_TYPES = ("layer_norm", "scale_norm")
ACTIVATION_FUNCTIONS = ("relu", "gelu")

# Other toolkits' names for options of this config (fairseq/FSMT, torch.nn.Transformer, Marian/BART
# in transformers), refused with ours: stored silently, they would build another model without a word.
FOREIGN_OPTION_NAMES = {
    "normalize_before": "norm_order='pre'",
    "encoder_normalize_before": "norm_order='pre' (one setting for both stacks)",
    "decoder_normalize_before": "norm_order='pre' (one setting for both stacks)",
    "norm_first": "norm_order='pre'",
    "pre_norm": "norm_order='pre'",
    "share_all_embeddings": "share_encoder_decoder_embeddings",
    "share_decoder_input_output_embed": "tie_word_embeddings",
    "encoder_embed_dim": "d_model",
    "decoder_embed_dim": "d_model",
    "embed_dim": "d_model",
    "encoder_ffn_embed_dim": "encoder_ffn_dim",
    "decoder_ffn_embed_dim": "decoder_ffn_dim",
    "dim_feedforward": "encoder_ffn_dim and decoder_ffn_dim",
    "nhead": "encoder_attention_heads and decoder_attention_heads",
    "num_heads": "encoder_attention_heads and decoder_attention_heads",
    "num_encoder_layers": "encoder_layers",
    "num_decoder_layers": "decoder_layers",
    "num_layers": "encoder_layers and decoder_layers",
    "activation_fn": "activation_function",
    "activation": "activation_function",
    "no_scale_embedding": "scale_embedding=False",
    "encoder_learned_pos": "position_embedding_type='learned'",
    "decoder_learned_pos": "position_embedding_type='learned'",
    "max_source_positions": "max_position_embeddings",
    "max_target_positions": "max_position_embeddings",
    "label_smoothing_factor": "label_smoothing",
    "attention_type": "attn_implementation (from_pretrained / set_attn_implementation)",
}


def _check_divisible(d_model: int, num_heads: int, name: str) -> None:
    if num_heads <= 0 or d_model % num_heads != 0:
        raise ValueError(
            f"d_model ({d_model}) must be divisible by {name} ({num_heads}): each head gets "
            f"head_dim = d_model / num_heads features (Vaswani et al. 2017, §3.2.2)"
        )


class TransformerSeq2SeqConfig(CheckedConfig):
    r"""Hyperparameters of [`TransformerSeq2SeqForConditionalGeneration`].

    Args:
        vocab_size: size of the (joint) vocabulary; also the rows of `embed_tokens` and `lm_head`.
        d_model: width of every residual stream, d_model in the paper.
        encoder_layers / decoder_layers: N, the number of stacked layers (paper: 6).
        encoder_attention_heads / decoder_attention_heads: h, heads per attention (paper: 8); must
            divide `d_model`.
        encoder_ffn_dim / decoder_ffn_dim: d_ff, the inner width of the feed-forward block (eq. 2).
        activation_function: `"relu"` (the paper, eq. 2) or `"gelu"`.
        dropout: P_drop on each sub-layer output and on the embedding sums (§5.4).
        attention_dropout: dropout on the attention probabilities (not in the paper; 0 disables it).
        activation_dropout: dropout after the feed-forward activation (not in the paper).
        position_embedding_type: `"sinusoidal"` (fixed, §3.5) or `"learned"` (the paper's variant,
            Table 3 row E).
        norm_order: `"post"`, LayerNorm(x + Sublayer(x)) as in the paper (§3.1), or `"pre"`,
            x + Sublayer(LayerNorm(x)) with a final LayerNorm after each stack (Wang et al. 2019,
            "Learning Deep Transformer Models for Machine Translation"), which trains without warm-up
            tricks at depth.
        norm_type: `"layer_norm"` (the paper: LayerNorm with a gain and a shift per feature) or
            `"scale_norm"`, g · x / ||x||_2 with one learned scalar g per norm, initialised to
            √d_model (Nguyen & Salazar 2019, "Transformers without Tears", §2; proposed with
            `norm_order="pre"` for low-resource pairs).
        fix_norm: token embeddings of unit L2 length, in the input embedding lookup (before the
            √d_model scaling) and in `lm_head`, whose logits become |h| · cos(h, e_w) (FixNorm,
            Nguyen & Chiang 2018; with `norm_type="scale_norm"` the final norm's g sets the
            logits' range, as in Nguyen & Salazar 2019, §2).
        scale_embedding: multiply token embeddings by √d_model (§3.4).
        max_position_embeddings: the longest source or target sequence (in tokens) the model accepts;
            longer inputs raise a `ValueError`.
        layer_norm_eps: epsilon of every LayerNorm (with ScaleNorm: the smallest ||x|| divided by).
        share_encoder_decoder_embeddings: one embedding matrix for source and target tokens (§3.4;
            needs a joint vocabulary).
        tie_word_embeddings: `lm_head` reuses the decoder's token embedding matrix (§3.4).
        label_smoothing: ε_ls of the training loss (§5.4; the paper uses 0.1).
        init_std: standard deviation of the token embeddings' normal initialisation; `None` means
            d_model^-0.5, so that embeddings scaled by √d_model start at unit variance.
        use_cpu_fast_paths: take the measured speed paths of `cpu_fast_paths.py` (eq. 1 as plain
            matmuls where torch's CPU SDPA kernel is slower, float32 attention under CPU half
            precision, cheaper CPU dropout masks, the padding-free encoder at inference, a prepacked
            `lm_head` while decoding, the fused loss). False runs the reference code only: the same
            logits, loss and gradients up to float rounding, the same `generate` output.

    Generation settings (`num_beams`, `max_new_tokens`, `length_penalty`, ...) passed here move to
    the model's `generation_config` with one warning; other unknown keys are stored with one warning.

    Raises:
        ValueError: `d_model` not divisible by a head count, or an unknown `position_embedding_type`,
            `norm_order`, `norm_type` or `activation_function` (the message names the valid values);
            a misspelt option, or another toolkit's name for one of ours (`normalize_before`,
            `share_all_embeddings`, ...: `FOREIGN_OPTION_NAMES`), naming ours.
    """

    model_type = "transformer_seq2seq"
    foreign_option_names = FOREIGN_OPTION_NAMES
    keys_to_ignore_at_inference = ["cache"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        # The only per-layer state at generation time is the decoder's cache.
        "num_hidden_layers": "decoder_layers",
    }

    vocab_size: int = 32000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation_function: str = "relu"
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    position_embedding_type: str = "sinusoidal"
    norm_order: str = "post"
    norm_type: str = "layer_norm"
    fix_norm: bool = False
    scale_embedding: bool = True
    max_position_embeddings: int = 1024
    layer_norm_eps: float = 1e-5
    share_encoder_decoder_embeddings: bool = True
    tie_word_embeddings: bool = True
    label_smoothing: float = 0.0
    init_std: float | None = None
    use_cpu_fast_paths: bool = True
    use_cache: bool = True
    is_encoder_decoder: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    decoder_start_token_id: int | None = 1

    def check_options(self) -> None:
        _check_divisible(self.d_model, self.encoder_attention_heads, "encoder_attention_heads")
        _check_divisible(self.d_model, self.decoder_attention_heads, "decoder_attention_heads")
        check_choice("position_embedding_type", self.position_embedding_type, POSITION_EMBEDDING_TYPES)
        check_choice("norm_order", self.norm_order, NORM_ORDERS)
        check_choice("norm_type", self.norm_type, NORM_TYPES)
        check_choice("activation_function", self.activation_function, ACTIVATION_FUNCTIONS)
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1); got {self.label_smoothing}")
        if self.max_position_embeddings <= 0:
            raise ValueError(f"max_position_embeddings must be positive; got {self.max_position_embeddings}")


__all__ = ["TransformerSeq2SeqConfig"]
