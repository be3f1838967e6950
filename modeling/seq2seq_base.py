"""What both model families' transformers classes share.

`Seq2SeqModelMixin`, for each `...Model`: `forward` (arguments, defaults, the encoder run or its
given outputs), which hands the decoding to the family's `decode`. `Seq2SeqLMMixin`, for each
`...ForConditionalGeneration`: the embedding accessors, the generation defaults and the
language-model `forward` around the family's `model`; the family supplies `model`, `lm_head`,
`lm_output_class` (the output dataclass) and, where the logits are more than
`lm_head(hidden_states)`, `output_logits` (the Transformer's FixNorm).

Shipped to the Hub next to the modeling files (a flat sibling); imports torch and transformers only.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_outputs import ModelOutput
from transformers.utils.deprecation import deprecate_kwarg

from .losses import seq2seq_lm_loss, shift_tokens_right


class Seq2SeqModelMixin:
    """Put first in the bases of a `...Model` class (before its `PreTrainedModel`); the family writes
    `encoder_outputs_from_tuple` and `decode`."""

    def get_encoder(self, modality: str | None = None) -> nn.Module:
        return self.encoder

    def get_decoder(self) -> nn.Module:
        return self.decoder

    # `past_key_values` is the old name of `cache`: accepted with a FutureWarning, as transformers' own
    # seq2seq models (Marian, BART) accept it, until the version they drop it in.
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs=None,
        cache=None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ):
        """Encode `input_ids` (unless `encoder_outputs` are given) and decode `decoder_input_ids`.

        Args:
            input_ids: (batch, src_len) source ids, `</s>`-terminated, right-padded.
            attention_mask: (batch, src_len), 1 for tokens, 0 for padding.
            decoder_input_ids: (batch, tgt_len) decoder inputs, starting with `<s>`
                (`decoder_start_token_id`); with a `cache`, only the tokens the cache has not seen.
            decoder_attention_mask: (batch, past_length + tgt_len) decoder padding mask (optional;
                the RNN ignores it: causality already hides later, padded, positions).
            encoder_outputs: the encoder's output (a `ModelOutput`, or its `to_tuple()`); skips the
                encoder.
            cache: the decoding state of an earlier call (generation): the Transformer's
                `EncoderDecoderCache`, the RNN's `RNNDecoderCache`.
            use_cache: return the cache; defaults to `config.use_cache` in eval mode, False in
                training mode (a training forward has no later step to reuse it).
            output_attentions / output_hidden_states / return_dict: as in transformers.

        Returns:
            The family's `Seq2SeqModelOutput`: last_hidden_state (batch, tgt_len, hidden), the
            vector the output layer reads; cache; encoder_last_hidden_state (batch, src_len, hidden);
            and, when asked, attentions and hidden states (see the family's `decode`).

        Raises:
            ValueError: no `decoder_input_ids`, neither `input_ids` nor `encoder_outputs`, a row of
                `attention_mask` that is all 0, or (Transformer) a sequence longer than
                `max_position_embeddings`.
        """
        config = self.config
        if decoder_input_ids is None:
            raise ValueError("decoder_input_ids are required (or pass labels to the ForConditionalGeneration model)")
        output_attentions = config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
        return_dict = config.return_dict if return_dict is None else return_dict
        if use_cache is None:
            use_cache = config.use_cache and not self.training
        if encoder_outputs is None:
            if input_ids is None:
                raise ValueError("pass either input_ids or encoder_outputs")
            encoder_outputs = self.encoder(
                input_ids,
                attention_mask=attention_mask,
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
            )
        elif not isinstance(encoder_outputs, ModelOutput):
            encoder_outputs = self.encoder_outputs_from_tuple(tuple(encoder_outputs))
        output = self.decode(
            decoder_input_ids,
            encoder_outputs,
            attention_mask,
            decoder_attention_mask,
            cache,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        return output if return_dict else output.to_tuple()


class Seq2SeqLMMixin:
    """Put first in the bases of a `...ForConditionalGeneration` class (before its `PreTrainedModel`)."""

    # forward takes `num_items_in_batch` (transformers' loss-kwargs contract): Trainer then passes
    # the target-token count of the whole accumulated update and does not rescale the loss itself.
    accepts_loss_kwargs = True

    def set_generation_defaults(self, config) -> None:
        """Beam search with 5 beams and at most 128 new tokens (saved as generation_config.json), then
        the generation settings passed to the config (`num_beams=3`, ...), which moved them out of it."""
        self.generation_config.num_beams = 5
        self.generation_config.max_new_tokens = 128
        for name, value in (getattr(config, "_generation_settings", None) or {}).items():
            setattr(self.generation_config, name, value)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def get_encoder(self, modality: str | None = None) -> nn.Module:
        return self.model.encoder

    def get_decoder(self) -> nn.Module:
        return self.model.decoder

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Teacher-forcing inputs for `labels` (batch, tgt_len): shifted right behind the start token,
        -100 replaced by padding. `DataCollatorForSeq2Seq` and `Seq2SeqTrainer`'s label smoothing call
        this when they take the labels away from the model."""
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def output_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(batch, tgt_len, hidden) decoder features → (batch, tgt_len, vocab_size) logits."""
        return self.lm_head(hidden_states)

    @staticmethod
    def _refuse_inputs_embeds(inputs_embeds, decoder_inputs_embeds) -> None:
        """`forward` takes `inputs_embeds` / `decoder_inputs_embeds` so that callers which pass them as
        None (peft's `PeftModelForSeq2SeqLM`, i.e. `LoraConfig(task_type="SEQ_2_SEQ_LM")`) work;
        embeddings given in place of ids are refused in one line.

        Raises:
            ValueError: either is not None.
        """
        if inputs_embeds is not None or decoder_inputs_embeds is not None:
            raise ValueError(
                "inputs_embeds / decoder_inputs_embeds are not supported: pass input_ids and decoder_input_ids "
                "(or labels); prompt-learning methods that feed embeddings need them"
            )

    # `past_key_values` is the old name of `cache`: accepted with a FutureWarning, as transformers' own
    # seq2seq models (Marian, BART) accept it, until the version they drop it in.
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        encoder_outputs=None,
        cache=None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
    ):
        """Next-token logits for every decoder position, and the loss when `labels` are given.

        Args:
            labels: (batch, tgt_len) target ids, -100 on padding. Without `decoder_input_ids`,
                those are `shift_tokens_right(labels)`: `<s>` followed by the labels but the last.
                With labels no cache is returned (a training forward has no later step to reuse it).
            num_items_in_batch: the number of labels that are not -100 in the whole update (all
                micro-batches of a gradient accumulation, all processes); the loss is then the sum
                over this batch's kept positions divided by it, so that accumulated micro-batches
                add up to the full batch's mean. transformers' Trainer passes it. None: divide by
                this batch's own count.
            inputs_embeds, decoder_inputs_embeds: accepted as None only (peft's
                `PeftModelForSeq2SeqLM` passes them), see `_refuse_inputs_embeds`.
            Others: see the family's `...Model.forward`.

        Returns:
            `lm_output_class`: loss (`seq2seq_lm_loss`: the label-smoothed cross-entropy over the
            positions whose label is not -100, plus the RNN's coverage loss), logits (batch,
            tgt_len, vocab_size), and the fields of the model's output.

        Raises:
            ValueError: `inputs_embeds` or `decoder_inputs_embeds` given.
        """
        self._refuse_inputs_embeds(inputs_embeds, decoder_inputs_embeds)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.output_logits(outputs.last_hidden_state)  # (batch, tgt_len, vocab_size)
        loss = None
        if labels is not None:  # the RNN's coverage penalty is added here, and only here (See et al. 2017, eq. 13)
            coverage_penalty = getattr(outputs, "coverage_penalty", None)
            loss = seq2seq_lm_loss(logits, labels, self.config, num_items_in_batch, coverage_penalty)
        fields = {name: value for name, value in outputs.items() if name != "last_hidden_state"}
        output = self.lm_output_class(loss=loss, logits=logits, **fields)
        return output if return_dict else output.to_tuple()


__all__ = ["Seq2SeqLMMixin", "Seq2SeqModelMixin"]
