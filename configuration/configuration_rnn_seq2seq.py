"""Configuration of the RNN encoder-decoder with attention (``model_type="rnn_seq2seq"``).

One config describes every variant of the seed texts: the traditional encoder-decoder
(``attention="none"``), Bahdanau et al. (2015) and Luong et al. (2015) attention with their scores,
local windows, input feeding, hard attention and coverage. Every choice is validated here, in the
constructor, so a misspelt or meaningless combination fails before a model is built.
"""

from __future__ import annotations

from .configuration_checks import CheckedConfig, check_choice

CELL_TYPES = ("gru", "lstm")
BRIDGES = ("zero", "last", "projection")
ATTENTIONS = ("none", "bahdanau", "luong")
LUONG_SCORES = ("dot", "general", "concat", "cosine", "scaled_dot")
WINDOWS = ("global", "local-m", "local-p")
ATTENTION_MODES = ("soft", "hard")

# Other toolkits' names for options of this config (OpenNMT-py, Joey NMT, fairseq, torch), refused
# with ours: stored silently, they would build another model without a word.
FOREIGN_OPTION_NAMES = {
    "rnn_type": "cell_type='gru' or 'lstm'",
    "cell": "cell_type='gru' or 'lstm'",
    "attention_type": "attention='bahdanau' or 'luong' (and score= for Luong's score)",
    "global_attention": "attention='luong' with score=",
    "input_feed": "input_feeding",
    "brnn": "bidirectional",
    "bidir": "bidirectional",
    "encoder_type": "bidirectional",
    "enc_layers": "encoder_layers",
    "dec_layers": "decoder_layers",
    "layers": "encoder_layers and decoder_layers",
    "num_layers": "encoder_layers and decoder_layers",
    "rnn_size": "hidden_size",
    "hidden_dim": "hidden_size",
    "word_vec_size": "embedding_size",
    "emb_size": "embedding_size",
    "embedding_dim": "embedding_size",
    "coverage_attn": "coverage",
    "lambda_coverage": "coverage_loss_weight",
    "share_decoder_embeddings": "tie_word_embeddings",
    "tied_softmax": "tie_word_embeddings",
    "share_all_embeddings": "share_embeddings",
    "param_init": "init_range",
    "init_weight": "init_range",
    "label_smoothing_factor": "label_smoothing",
}


class RNNSeq2SeqConfig(CheckedConfig):
    r"""Configuration of [`RNNSeq2SeqForConditionalGeneration`].

    Sizes
        vocab_size: one joint vocabulary for source and target (the package's tokenizers are joint).
        embedding_size: width of the token embeddings.
        hidden_size: width of the decoder RNN, of h̃_t (Luong) and of the attention's hidden layer.
        encoder_hidden_size: width of each encoder direction. ``None`` picks ``hidden_size // 2``
            for a bidirectional encoder (so [h→; h←] has ``hidden_size`` units, as in OpenNMT-py)
            and ``hidden_size`` otherwise.
        cell_type: ``"gru"`` or ``"lstm"``, for encoder and decoder.
        encoder_layers, decoder_layers: stacked RNN layers on each side.
        bidirectional: whether the encoder reads the source in both directions.
        dropout: dropout on embeddings, between stacked RNN layers and before the output layer.

    Bridge (the decoder's initial state, per layer l, from the encoder's final state of layer l)
        ``"zero"``: s_0 = 0. ``"last"``: s_0 = [h→_S; h←_1] (sizes must match).
        ``"projection"``: s_0 = tanh(W_l [h→_S; h←_1]) (Bahdanau et al. 2015, A.2.2, which uses
        h←_1 only; we feed both directions). With an LSTM the cell state is bridged the same way
        with its own weights. ``"last"`` and ``"projection"`` need ``encoder_layers ==
        decoder_layers``.

    Attention
        attention: ``"none"`` (the decoder sees only the bridged encoder state), ``"bahdanau"``
            (score on s_{i-1}, context into the RNN input and the deep output) or ``"luong"``
            (RNN first, then the score on h_t, then h̃_t = tanh(W_c[c_t; h_t])).
        score: Luong's score: ``"dot"``, ``"general"`` (default), ``"concat"``, or ``"cosine"``
            (Graves et al. 2014) and ``"scaled_dot"`` (Vaswani et al. 2017). Bahdanau attention
            always uses its additive score, so ``score`` stays ``None`` there.
        window: ``"global"`` (default), ``"local-m"`` or ``"local-p"`` (Luong et al. 2015, §3.2;
            Luong attention only), with half-width ``window_size`` (D, default 10).
        input_feeding: Luong's input feeding (§3.3): h̃_{t-1} joins the next RNN input. Default
            ``True`` for Luong; not defined for the other attentions. Speed: without input feeding
            (and without coverage) the decoder RNN runs over the whole target in one call and
            attends every position at once; with it, the decoder steps one token at a time.
        attention_mode: ``"soft"`` (default) or ``"hard"`` (one-hot on the argmax, trained with the
            straight-through estimator).
        coverage: a coverage vector (sum of past attention weights) enters the additive score
            (Tu et al. 2016; See et al. 2017, eq. 11); needs an additive score (Bahdanau, or
            Luong with ``score="concat"``). coverage_loss_weight: λ of See et al. (2017), eq. 13
            (default 1.0 when coverage is on).

    Output and loss
        tie_word_embeddings: share the decoder embedding matrix with the output layer (the vector
            fed to ``lm_head`` must then have ``embedding_size`` units).
        share_embeddings: one embedding matrix for encoder and decoder (joint vocabulary).
        label_smoothing: ε of the label-smoothed cross-entropy.
        init_range: every parameter starts uniform in [-init_range, init_range] (Luong et al. 2015,
            §4.1; Bahdanau et al. use a similar small range).
        use_cpu_fast_paths: compute the training loss with the fused cross-entropy of
            ``cpu_fast_paths.py`` (less peak memory, cache-sized blocks on a CPU); False runs the
            reference ``F.cross_entropy`` with the same numbers up to float rounding.

    Raises:
        ValueError: for an unknown value (the message names the valid ones), for a combination
            that has no meaning (e.g. ``window`` with ``attention="none"``, ``input_feeding`` with
            Bahdanau attention), for a misspelt option name close to a real one, and for another
            toolkit's name for one of ours (``rnn_type``, ``input_feed``, ...:
            ``FOREIGN_OPTION_NAMES``), naming ours.

    Generation settings (``num_beams``, ``max_new_tokens``, ``length_penalty``, ...) passed here move
    to the model's ``generation_config`` with one warning; other unknown keys are stored with one
    warning.
    """

    model_type = "rnn_seq2seq"
    foreign_option_names = FOREIGN_OPTION_NAMES
    attribute_map = {"num_hidden_layers": "decoder_layers"}

    vocab_size: int = 8000
    embedding_size: int = 256
    hidden_size: int = 512
    encoder_hidden_size: int | None = None
    cell_type: str = "gru"
    encoder_layers: int = 1
    decoder_layers: int = 1
    bidirectional: bool = True
    dropout: float | int = 0.1
    bridge: str = "projection"
    attention: str = "luong"
    score: str | None = None
    window: str | None = None
    window_size: int | None = None
    input_feeding: bool | None = None
    attention_mode: str | None = None
    coverage: bool = False
    coverage_loss_weight: float | int | None = None
    tie_word_embeddings: bool = False
    share_embeddings: bool = False
    label_smoothing: float | int = 0.0
    init_range: float | int = 0.1
    use_cpu_fast_paths: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 1
    is_encoder_decoder: bool = True
    use_cache: bool = True

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def encoder_output_size(self) -> int:
        """Width of the encoder's outputs h_j = [h→_j; h←_j], the attention's keys and values."""
        return self.encoder_hidden_size * self.num_directions

    @property
    def output_feature_size(self) -> int:
        """Width of the vector the decoder hands to ``lm_head``."""
        if self.attention == "bahdanau":
            return self.embedding_size  # the maxout deep output (A.2.2) ends in embedding space
        return self.hidden_size  # s_t (no attention) or h̃_t (Luong)

    @property
    def is_stepwise(self) -> bool:
        """Whether the decoder must run one target step at a time (a step depends on the last
        step's attention): Bahdanau attention, Luong input feeding, coverage."""
        return self.attention == "bahdanau" or bool(self.input_feeding) or self.coverage

    def check_options(self) -> None:
        check_choice("cell_type", self.cell_type, CELL_TYPES)
        check_choice("bridge", self.bridge, BRIDGES)
        check_choice("attention", self.attention, ATTENTIONS)
        # The types are checked already (CheckedConfig: check_field_types); here the ranges.
        for name in ("vocab_size", "embedding_size", "hidden_size", "encoder_layers", "decoder_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer; got {getattr(self, name)!r}")
        for name in ("dropout", "label_smoothing"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must lie in [0, 1); got {getattr(self, name)!r}")

        # Sizes and the bridge.
        if self.encoder_hidden_size is None:
            if self.bidirectional and self.hidden_size % 2:
                raise ValueError(
                    "a bidirectional encoder splits hidden_size over two directions, so hidden_size must be "
                    f"even (or set encoder_hidden_size); got hidden_size={self.hidden_size}"
                )
            self.encoder_hidden_size = self.hidden_size // self.num_directions
        if self.encoder_hidden_size < 1:
            raise ValueError(
                f"encoder_hidden_size must be a positive integer or None; got {self.encoder_hidden_size!r}"
            )
        if self.bridge != "zero" and self.encoder_layers != self.decoder_layers:
            raise ValueError(
                f"bridge={self.bridge!r} maps encoder layer l to decoder layer l, so it needs encoder_layers == "
                f"decoder_layers (got {self.encoder_layers} and {self.decoder_layers}); use bridge='zero' otherwise"
            )
        if self.bridge == "last" and self.encoder_output_size != self.hidden_size:
            raise ValueError(
                f"bridge='last' copies the encoder state ({self.encoder_output_size} units = encoder_hidden_size x "
                f"directions) into the decoder ({self.hidden_size} units); make them equal or use bridge='projection'"
            )
        if self.attention == "none" and self.bridge == "zero":
            raise ValueError(
                "attention='none' with bridge='zero' gives a decoder that never sees the source; "
                "use bridge='last' or 'projection'"
            )

        # Attention options: each one belongs to some attention types only.
        attending = self.attention != "none"
        if not attending:
            for name in ("score", "window", "window_size", "attention_mode", "coverage_loss_weight"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name} has no meaning with attention='none'; set attention to 'bahdanau' or 'luong'"
                    )
            if self.coverage:
                raise ValueError(
                    "coverage has no meaning with attention='none'; set attention to 'bahdanau' or 'luong'"
                )
        if self.attention == "bahdanau" and self.score is not None:
            raise ValueError(
                f"score={self.score!r} is a Luong score; attention='bahdanau' always uses its additive score "
                "(use attention='luong' with score='concat' for the additive score after the RNN step)"
            )
        if self.attention == "luong":
            self.score = "general" if self.score is None else self.score
            check_choice("score", self.score, LUONG_SCORES)
            if self.score in ("dot", "cosine", "scaled_dot") and self.encoder_output_size != self.hidden_size:
                raise ValueError(
                    f"score={self.score!r} compares h_t ({self.hidden_size} units) with the encoder outputs "
                    f"({self.encoder_output_size} units) directly; make them equal or use 'general' or 'concat'"
                )

        if attending:
            self.window = "global" if self.window is None else self.window
            check_choice("window", self.window, WINDOWS)
            if self.window != "global" and self.attention != "luong":
                raise ValueError(
                    f"window={self.window!r} is Luong's local attention (§3.2) and needs attention='luong'; "
                    f"attention={self.attention!r} supports window='global' only"
                )
            if self.window == "global":
                if self.window_size is not None:
                    raise ValueError(
                        "window_size (D) applies to window='local-m' or 'local-p' only; got window='global'"
                    )
            else:
                self.window_size = 10 if self.window_size is None else self.window_size
                if self.window_size < 1:
                    raise ValueError(f"window_size (D) must be a positive integer; got {self.window_size!r}")
            self.attention_mode = "soft" if self.attention_mode is None else self.attention_mode
            check_choice("attention_mode", self.attention_mode, ATTENTION_MODES)

        if self.attention == "luong":
            self.input_feeding = True if self.input_feeding is None else self.input_feeding
        elif self.input_feeding:
            raise ValueError(
                f"input_feeding is Luong's (§3.3) and needs attention='luong'; got attention={self.attention!r} "
                "(Bahdanau attention already feeds the context into the RNN input)"
            )
        else:
            self.input_feeding = False

        if self.coverage:
            if not (self.attention == "bahdanau" or self.score == "concat"):
                raise ValueError(
                    "coverage enters an additive score (See et al. 2017, eq. 11); use attention='bahdanau' or "
                    f"attention='luong' with score='concat'; got score={self.score!r}"
                )
            self.coverage_loss_weight = 1.0 if self.coverage_loss_weight is None else self.coverage_loss_weight
            if self.coverage_loss_weight < 0:
                raise ValueError(f"coverage_loss_weight must be >= 0; got {self.coverage_loss_weight!r}")
        elif self.coverage_loss_weight is not None:
            raise ValueError("coverage_loss_weight needs coverage=True")

        # Output layer.
        if self.tie_word_embeddings and self.output_feature_size != self.embedding_size:
            raise ValueError(
                f"tie_word_embeddings needs the output vector ({self.output_feature_size} units: hidden_size for "
                f"attention={self.attention!r}) to match embedding_size ({self.embedding_size})"
            )


__all__ = ["RNNSeq2SeqConfig"]
