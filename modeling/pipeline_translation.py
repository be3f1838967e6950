"""The ``"translation"`` pipeline shipped with every exported model.

transformers v5 removed ``pipeline("translation")`` and ``pipeline("text2text-generation")``. An
exported model lists this class in ``config.custom_pipelines`` for both tasks, so that

    pipe = pipeline("translation", model="<repo or folder>", trust_remote_code=True)
    pipe(["Ein Hund läuft.", "Zwei Männer."], batch_size=2, num_beams=4)
    # [{"translation_text": "A dog runs."}, {"translation_text": "Two men."}]

behaves like transformers v4's ``TranslationPipeline``. With ``return_attention=True`` each result
also carries the cross-attention alignment of the generated translation.

This file ships flat next to the model code in the Hub folder: it imports only the standard
library, torch, transformers and its flat sibling ``attention_pass`` (the teacher-forced pass that
reads the attention, shared with the rest of the package).
"""

from __future__ import annotations

import inspect

import torch
from transformers import GenerationConfig, Pipeline
from transformers.utils import ModelOutput

from .attention_pass import force_sequences

# Options of this pipeline itself; every other keyword must be a generation option.
_PIPELINE_OPTIONS = (
    "return_text",
    "return_tensors",
    "return_attention",
    "clean_up_tokenization_spaces",
    "truncation",
)


class Seq2SeqTranslationPipeline(Pipeline):
    """Translate text with an encoder-decoder model: tokenize, ``generate``, decode.

    Call with one string or a list of strings (``batch_size`` batches them, padding to the
    longest source). Keyword options:

    - any ``generate`` option (``num_beams``, ``max_new_tokens``, ``do_sample``, ``top_k``,
      ``num_return_sequences``, a ``generation_config``, ...), at construction or per call; they
      override the model's ``generation_config``.
    - ``return_text`` (default True): add ``"translation_text"`` (``"generated_text"`` for the
      ``"text2text-generation"`` task).
    - ``return_tensors`` (default False): add ``"translation_token_ids"``, the generated ids.
    - ``return_attention`` (default False): add ``"attention"``, a dict with ``source_tokens``
      (the source pieces, ``</s>`` included), ``target_tokens`` (the generated pieces up to and
      including ``</s>``, without the decoder start token) and ``weights``, a
      ``len(target_tokens) x len(source_tokens)`` list of rows: the last decoder layer's
      cross-attention, averaged over heads, when predicting each target token. The weights come
      from one teacher-forced forward pass over the generated sequence.
    - ``clean_up_tokenization_spaces`` (default False), ``truncation`` (default False: a source
      longer than the tokenizer's ``model_max_length`` is not cut).

    Returns, as v4 did: for one string, a list with one dict per returned sequence; for a list of
    strings, one such list per input, flattened to one dict per input when each input has exactly
    one result.

    Raises ``TypeError`` for an unknown keyword option or an input that is not a string.
    """

    _pipeline_calls_generate = True
    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_video_processor = False
    _load_feature_extractor = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # v4 named the outputs after the task: translation_text / generated_text.
        self.return_name = "generated" if self.task == "text2text-generation" else "translation"

    # ------------------------------------------------------------------ parameters

    def _sanitize_parameters(
        self,
        return_text=None,
        return_tensors=None,
        return_attention=None,
        clean_up_tokenization_spaces=None,
        truncation=None,
        **generate_kwargs,
    ):
        unknown = sorted(set(generate_kwargs) - self._generate_option_names())
        if unknown:
            raise TypeError(
                f"{type(self).__name__} got unknown option(s) {unknown}; valid options are "
                f"{', '.join(_PIPELINE_OPTIONS)} and the generate options (GenerationConfig fields "
                "such as num_beams, max_new_tokens, do_sample, num_return_sequences)"
            )
        preprocess_params = {} if truncation is None else {"truncation": truncation}
        postprocess_params = {
            "return_text": return_text,
            "return_tensors": return_tensors,
            "return_attention": return_attention,
            "clean_up_tokenization_spaces": clean_up_tokenization_spaces,
        }
        postprocess_params = {key: value for key, value in postprocess_params.items() if value is not None}
        forward_params = dict(generate_kwargs)
        if return_attention is not None:
            forward_params["return_attention"] = return_attention
        return preprocess_params, forward_params, postprocess_params

    def _generate_option_names(self) -> set[str]:
        names = {key for key in vars(GenerationConfig()) if not key.startswith("_")}
        parameters = inspect.signature(self.model.generate).parameters.values()
        names.update(p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD)
        names.discard("self")
        return names

    # ------------------------------------------------------------------ call

    def __call__(self, inputs, **kwargs):
        """Translate ``inputs`` (a string or a list of strings); see the class docstring."""
        if isinstance(inputs, list) and not inputs:
            return []
        result = super().__call__(inputs, **kwargs)
        if isinstance(inputs, list) and all(len(records) == 1 for records in result):
            return [records[0] for records in result]
        return result

    def preprocess(self, text, truncation=False):
        if not isinstance(text, str):
            raise TypeError(
                f"{type(self).__name__} translates a string or a list of strings; got {type(text).__name__}"
            )
        encoded = self.tokenizer(text, truncation=truncation, return_tensors="pt")
        # Only what the encoder reads: some tokenizers also return token_type_ids.
        return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}

    def _forward(self, model_inputs, return_attention=False, **generate_kwargs):
        input_ids = model_inputs["input_ids"]  # (batch, src_len)
        attention_mask = model_inputs["attention_mask"]  # (batch, src_len)
        batch = input_ids.shape[0]

        output = self.model.generate(
            input_ids=input_ids, attention_mask=attention_mask, **self._prepare_generate_kwargs(generate_kwargs)
        )
        sequences = output.sequences if isinstance(output, ModelOutput) else output  # (batch * n, out_len)
        per_input = sequences.shape[0] // batch
        model_outputs = {"output_ids": sequences.reshape(batch, per_input, -1)}  # (batch, n, out_len)
        if return_attention:
            weights, lengths = self._cross_attention(input_ids, attention_mask, sequences, per_input)
            model_outputs["cross_attention"] = weights.reshape(batch, per_input, *weights.shape[1:])
            model_outputs["target_lengths"] = lengths.reshape(batch, per_input)
            model_outputs["input_ids"] = input_ids
            model_outputs["attention_mask"] = attention_mask
        return model_outputs

    def _cross_attention(self, input_ids, attention_mask, sequences, per_input):
        """Last-layer cross-attention, head-averaged, of the teacher-forced pass over ``sequences``
        (``attention_pass.force_sequences``: each translation cut after its ``</s>``, or before
        padding).

        Returns ``(weights, lengths)``: weights (batch * n, tgt_len, src_len), row t the attention
        when predicting token t + 1 of ``sequences`` (token 0 is the decoder start token); lengths
        (batch * n,) each translation's length without the start token, ``</s>`` included.

        Raises ``ValueError`` when the model returns no cross-attention.
        """
        forced = force_sequences(
            self.model,
            input_ids.repeat_interleave(per_input, dim=0),
            attention_mask.repeat_interleave(per_input, dim=0),
            sequences,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        if forced is None:  # nothing generated after the start token
            lengths = torch.zeros(sequences.shape[0], dtype=torch.long, device=sequences.device)
            return sequences.new_zeros((sequences.shape[0], 0, input_ids.shape[1]), dtype=torch.float), lengths
        if not forced.outputs.cross_attentions:
            raise ValueError(
                f"{type(self.model).__name__} returned no cross_attentions with output_attentions=True; "
                "return_attention=True needs them"
            )
        lengths = torch.tensor([len(target) for target in forced.targets], device=sequences.device)
        return forced.outputs.cross_attentions[-1].float().mean(dim=1), lengths  # (batch * n, tgt_len, src_len)

    def postprocess(
        self,
        model_outputs,
        return_text=True,
        return_tensors=False,
        return_attention=False,
        clean_up_tokenization_spaces=False,
    ):
        records = []
        for index, output_ids in enumerate(model_outputs["output_ids"][0]):
            record = {}
            if return_tensors:
                record[f"{self.return_name}_token_ids"] = output_ids
            if return_text:
                record[f"{self.return_name}_text"] = self.tokenizer.decode(
                    output_ids,
                    skip_special_tokens=True,
                    clean_up_tokenization_spaces=clean_up_tokenization_spaces,
                )
            if return_attention:
                record["attention"] = self._alignment(
                    model_outputs["input_ids"][0],
                    model_outputs["attention_mask"][0],
                    output_ids,
                    model_outputs["cross_attention"][0, index],
                    int(model_outputs["target_lengths"][0, index]),
                )
            records.append(record)
        return records

    def _alignment(self, input_ids, attention_mask, output_ids, weights, target_len):
        """The alignment of one translation: its source and target pieces and the weights between them."""
        source_positions = attention_mask.bool()
        source_ids = input_ids[source_positions]
        target_ids = output_ids[1 : target_len + 1]  # without the decoder start token, cut after </s>
        rows = weights[:target_len][:, source_positions]  # (target_len, real src_len)
        return {
            "source_tokens": self.tokenizer.convert_ids_to_tokens(source_ids.tolist()),
            "target_tokens": self.tokenizer.convert_ids_to_tokens(target_ids.tolist()),
            "weights": rows.tolist(),
        }
