"""The teacher-forced attention pass (modeling/attention_pass.py, attention/sentences.py) and the EOS
helper it reads (modeling/generation_lengths.py: eos_token_ids), on untrained tiny models of both families (seeded):
what the pass returns is checked against the model's own forward and generate, whatever the weights."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, GenerationConfig

from helpers import FAMILIES, tiny_run_config, tiny_tokenizer

from attention_seq2seq.attention.sentences import attention_pass
from attention_seq2seq.modeling.attention_pass import eager_attention, force_sequences, target_length
from attention_seq2seq.modeling.generation_lengths import eos_token_ids

SOURCES = ["Ein Hund läuft durch den Schnee.", "Zwei Männer.", "Eine Frau liest ein Buch im Park."]
REFERENCES = ["A dog runs through the snow.", "Two men.", "A woman reads."]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("attention-pass"))


@pytest.fixture(scope="module", params=FAMILIES)
def model(request, tokenizer):
    import attention_seq2seq  # noqa: F401  (registers the Auto classes)

    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(tiny_run_config(request.param, len(tokenizer))).eval()
    model.generation_config.max_new_tokens = 6
    return model


@pytest.mark.parametrize(
    "eos, expected",
    [(2, {2}), ([2, 5], {2, 5}), ((3,), {3}), (None, set()), (torch.tensor([2, 7]), {2, 7}), (torch.tensor(4), {4})],
)
def test_eos_token_ids_reads_every_spelling(eos, expected):
    config = GenerationConfig()
    config.eos_token_id = eos
    assert eos_token_ids(config) == expected


def test_target_length_cuts_after_eos_and_before_padding():
    assert target_length([5, 6, 2, 0, 0], {2}) == 3
    assert target_length([5, 6, 7], {2}) == 3  # ran to the length limit
    assert target_length([5, 0, 0], {2}, pad_token_id=0) == 1
    assert target_length([5, 0, 2], {2}) == 3  # without pad_token_id only </s> ends a target
    assert target_length([], {2}) == 0


def test_eager_attention_restores_the_implementation_even_after_an_error(model, tokenizer):
    if model.config.model_type != "transformer_seq2seq":
        pytest.skip("the RNN has no attention implementation to switch")
    model.set_attn_implementation("sdpa")
    with pytest.raises(RuntimeError, match="inside"):
        with eager_attention(model):
            assert model.config._attn_implementation == "eager"
            raise RuntimeError("inside")
    assert model.config._attn_implementation == "sdpa"
    sentence = attention_pass(model, tokenizer, SOURCES[:1]).sentences[0]  # weights, though SDPA gives none
    assert sentence.cross is not None
    assert model.config._attn_implementation == "sdpa"


def test_references_are_teacher_forced_as_the_models_labels(model, tokenizer):
    forced = attention_pass(model, tokenizer, SOURCES, REFERENCES, self_attention=True)
    assert forced.generated is None and len(forced.sentences) == len(SOURCES)
    for source, reference, sentence in zip(SOURCES, REFERENCES, forced.sentences):
        source_ids = tokenizer(source)["input_ids"]
        labels = tokenizer(text_target=reference)["input_ids"]
        assert sentence.source_ids == source_ids and sentence.target_ids == labels
        assert sentence.decoder_input_ids == [model.config.decoder_start_token_id] + labels[:-1]
        assert sentence.target_tokens[-1] == "</s>"
        with torch.no_grad():  # the same sentence alone, through labels
            alone = model(input_ids=torch.tensor([source_ids]), labels=torch.tensor([labels]), output_attentions=True)
        assert len(sentence.cross) == len(alone.cross_attentions)
        for ours, theirs in zip(sentence.cross, alone.cross_attentions):
            assert ours.shape == (theirs.shape[1], len(labels), len(source_ids))  # (num_heads, tgt_len, src_len)
            torch.testing.assert_close(ours, theirs[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(sentence.logits, alone.logits[0], atol=1e-4, rtol=1e-4)
        if model.config.model_type == "transformer_seq2seq":
            assert sentence.encoder_self[0].shape[1:] == (len(source_ids), len(source_ids))
            assert sentence.decoder_self[0].shape[1:] == (len(labels), len(labels))
        else:
            assert sentence.encoder_self is None and sentence.decoder_self is None


def test_translations_are_generates_first_sequences_cut_after_eos(model, tokenizer):
    kwargs = {"num_beams": 3, "num_return_sequences": 2, "max_new_tokens": 6}
    forced = attention_pass(model, tokenizer, SOURCES, generate_kwargs=kwargs)
    eos = eos_token_ids(model.generation_config)
    for b, sentence in enumerate(forced.sentences):
        row = forced.generated[2 * b].tolist()  # the best of the source's two returned sequences
        assert sentence.decoder_input_ids[0] == row[0]
        cut = target_length(row[1:], eos)
        assert sentence.target_ids == row[1 : 1 + cut]
        assert sentence.decoder_input_ids == row[:cut]
        assert sentence.cross[0].shape[-2:] == (cut, len(tokenizer(SOURCES[b])["input_ids"]))


def test_a_batch_gives_each_sentence_what_it_gets_alone(model, tokenizer):
    batch = attention_pass(model, tokenizer, SOURCES, REFERENCES, offsets=True)
    for b, sentence in enumerate(batch.sentences):
        alone = attention_pass(model, tokenizer, [SOURCES[b]], [REFERENCES[b]], offsets=True).sentences[0]
        assert sentence.source_tokens == alone.source_tokens and sentence.target_tokens == alone.target_tokens
        assert sentence.source_offsets == alone.source_offsets and sentence.target_offsets == alone.target_offsets
        for ours, theirs in zip(sentence.cross, alone.cross):
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_force_sequences_reads_padded_generate_output(model, tokenizer):
    encoded = tokenizer(SOURCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        sequences = model.generate(**encoded, num_beams=1, max_new_tokens=6)
    forced = force_sequences(model, encoded["input_ids"], encoded["attention_mask"], sequences)
    eos = eos_token_ids(model.generation_config)
    assert forced.targets == [row[1:][: target_length(row[1:], eos)] for row in sequences.tolist()]
    assert forced.outputs.cross_attentions[0].shape[:3] == (
        len(SOURCES),
        forced.outputs.cross_attentions[0].shape[1],
        max(len(t) for t in forced.targets),
    )
    start_only = sequences[:, :1]
    assert force_sequences(model, encoded["input_ids"], encoded["attention_mask"], start_only) is None
