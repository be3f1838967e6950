"""Tests of hub/model_card.py: Hub metadata from metrics.json and a body that describes the model."""

from __future__ import annotations

import pytest
from huggingface_hub import ModelCard
from transformers import GenerationConfig

from attention_seq2seq import RNNSeq2SeqConfig, TransformerSeq2SeqConfig
from attention_seq2seq.hub.model_card import CITATIONS, ModelCardError, fill, public_spec, render_model_card

BLEU_SIG = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1"
CHRF_SIG = "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.5.1"


def _metrics(spec="multi30k:/data/multi30k", name="Multi30k", src="de", tgt="en", license="non-commercial research"):
    return {
        "model_family": "rnn_seq2seq",
        "corpus": {"spec": spec, "name": name, "source_lang": src, "target_lang": tgt, "license": license,
                   "attribution": "see the corpus README"},  # fmt: skip
        "train": {"steps": 1234, "epochs": 1.5, "wall_time_s": 600.0, "target_tokens_per_s": 2500.0,
                  "final_train_loss": 2.1},  # fmt: skip
        "validation": [{"step": 500, "loss": 3.1, "perplexity": 22.2, "bleu": 10.1, "chrf": 30.2}],
        "test": {
            "test2016": {"split": "test", "num_sentences": 1000, "num_beams": 5, "bleu": 35.417, "chrf": 61.02,
                         "bleu_signature": BLEU_SIG, "chrf_signature": CHRF_SIG},
            "val": {"split": "validation", "num_sentences": 1014, "num_beams": 5, "bleu": 36.5, "chrf": 62.25,
                    "bleu_signature": BLEU_SIG, "chrf_signature": CHRF_SIG},
        },
    }  # fmt: skip


def _render(config, metrics=None, recipe=None, **kwargs):
    generation_config = GenerationConfig(num_beams=5, max_new_tokens=64, decoder_start_token_id=1)
    return render_model_card(
        config=config,
        generation_config=generation_config,
        metrics=metrics,
        recipe=recipe,
        repo_id="someone/tiny-model",
        num_parameters=12345,
        **kwargs,
    )


RNN = dict(vocab_size=500, embedding_size=16, hidden_size=16)
TRANSFORMER = dict(vocab_size=500, d_model=16, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                   decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=48)  # fmt: skip


@pytest.mark.parametrize("config", [RNNSeq2SeqConfig(**RNN), TransformerSeq2SeqConfig(**TRANSFORMER)])
def test_metadata_and_model_index_come_from_metrics(config):
    metrics = _metrics()
    card = ModelCard(_render(config, metrics, base_model="someone/base-model"))
    data = card.data.to_dict()
    assert data["language"] == ["de", "en"]
    assert data["library_name"] == "transformers"
    assert data["pipeline_tag"] == "translation"
    assert data["datasets"] == ["bentrevett/multi30k"]
    assert data["metrics"] == ["bleu", "chrf"]
    assert data["base_model"] == "someone/base-model"
    assert {"translation", "custom_code"} <= set(data["tags"])
    assert ("rnn" in data["tags"]) == (config.model_type == "rnn_seq2seq")
    assert ("transformer" in data["tags"]) == (config.model_type == "transformer_seq2seq")
    # Multi30k's terms are non-commercial research: the card does not claim a permissive license.
    assert data["license"] == "other" and data["license_name"] and data["license_link"]

    results = {(r.dataset_name, r.metric_type): r for r in card.data.eval_results}
    assert set(results) == {(test, metric) for test in metrics["test"] for metric in ("bleu", "chrf")}
    for (test, metric), result in results.items():
        assert result.metric_value == metrics["test"][test][metric]
        assert result.metric_config == metrics["test"][test][f"{metric}_signature"]
        assert result.task_type == "translation"
        assert result.dataset_split == metrics["test"][test]["split"]
    # The body's table shows the same numbers and the signatures.
    assert "| test2016 | test | 1000 | 5 | 35.42 | 61.02 |" in card.text
    assert BLEU_SIG in card.text and CHRF_SIG in card.text


@pytest.mark.parametrize(
    "options, expected, citations",
    [
        (
            dict(attention="bahdanau", coverage=True),
            [r"e_{ij} = v_a^\top \tanh\left(W_a s_{i-1} + U_a h_j\right)", r"\mathrm{cov}^t", "λ = 1"],
            ["bahdanau2015", "tu2016", "see2017"],
        ),
        (
            dict(attention="luong", score="dot", window="local-m", window_size=2),
            [r"h_t^\top \bar{h}_s", "2D + 1 = 5", "Input feeding", r"\tilde{h}_t = \tanh"],
            ["luong2015"],
        ),
        (
            dict(attention="luong", score="concat", window="local-p", input_feeding=False, attention_mode="hard"),
            [r"p_t = S \cdot \mathrm{sigmoid}", r"v_a^\top \tanh\left(W_a [h_t; \bar{h}_s]\right)", "Hard attention"],
            ["luong2015"],
        ),
        (
            dict(attention="luong", score="cosine"),
            [r"\beta_t \dfrac{h_t^\top \bar{h}_s}", "Input feeding"],
            ["luong2015"],
        ),
        (dict(attention="none", bridge="last"), ["No attention", r"s_0 = \mathrm{bridge}(h_S)"], ["sutskever2014"]),
    ],
)
def test_rnn_card_writes_the_equations_of_its_variant(options, expected, citations):
    config = RNNSeq2SeqConfig(**RNN, **options)
    text = ModelCard(_render(config, _metrics())).text
    for snippet in expected:
        assert snippet in text
    for key in citations:
        assert CITATIONS[key] in text
    # Sections of other variants stay out.
    assert ("Input feeding" in text) == bool(config.input_feeding)
    assert ("Coverage" in text) == config.coverage
    assert ("local-p" in text) == (config.window == "local-p")


def test_transformer_card_reads_sizes_from_the_config():
    config = TransformerSeq2SeqConfig(**TRANSFORMER, norm_order="pre", position_embedding_type="learned")
    text = ModelCard(_render(config, _metrics())).text
    assert "| layers (encoder + decoder) | 2 + 3 |" in text
    assert "| attention heads (encoder / decoder) | 4 / 2 |" in text
    assert "| d_ff (encoder / decoder) | 32 / 48 |" in text
    assert "d_k = d_model / h = 4" in text
    assert "pre-norm" in text and "Table 3, row E" in text
    assert r"\mathrm{Attention}(Q, K, V)" in text and CITATIONS["vaswani2017"] in text
    assert "12,345 parameters" in text
    assert "ScaleNorm" not in text and "FixNorm" not in text and CITATIONS["nguyen2019"] not in text


def test_transformer_card_names_scale_norm_and_fix_norm_when_the_config_uses_them():
    config = TransformerSeq2SeqConfig(**TRANSFORMER, norm_order="pre", norm_type="scale_norm", fix_norm=True)
    text = ModelCard(_render(config, _metrics())).text
    assert "ScaleNorm (Nguyen & Salazar, 2019" in text and r"\lVert h \rVert \cos(h, e_w)" in text
    assert CITATIONS["nguyen2019"] in text and CITATIONS["nguyen2018"] in text


@pytest.mark.parametrize(
    "corpus, license, required",
    [
        (
            dict(
                spec="tsv:/data/tatoeba-cmn-eng/train.tsv",
                name="Tatoeba cmn-eng",
                src="zh",
                tgt="en",
                license="CC-BY 2.0 FR",
            ),  # fmt: skip
            "cc-by-2.0",
            ["Attribution: www.manythings.org/anki and tatoeba.org", "CC-BY 2.0 FR"],
        ),
        (
            dict(spec="bible:es-en", name="Bible RV1909-WEB", src="es", tgt="en", license="public domain"),
            "apache-2.0",
            ["public domain"],
        ),  # fmt: skip
        (dict(), "other", ["non-commercial research", CITATIONS["multi30k"], "Elliott"]),
        (
            dict(spec="jsonl:/data/x.jsonl", name="In-house", license="CC0"),
            "apache-2.0",
            ["`jsonl:x.jsonl` (In-house)", "CC0", "Attribution: see the corpus README"],
        ),  # fmt: skip
    ],
)
def test_training_data_carries_the_corpus_terms(corpus, license, required):
    card = ModelCard(_render(RNNSeq2SeqConfig(**RNN), _metrics(**corpus)))
    assert card.data.license == license
    assert "/data/" not in card.content  # no local path anywhere in the card
    for text in required:
        assert text in card.text


@pytest.mark.parametrize(
    "spec, name, expected",
    [
        ("hf:someone/parallel-corpus", "Parallel", "someone/parallel-corpus"),
        ("tsv:/data/tatoeba-cmn-eng/train.tsv", "Tatoeba cmn-eng", "tatoeba-cmn-eng"),
        ("multi30k:/data/multi30k", "Multi30k", "bentrevett/multi30k"),
        ("bible:es-en", "Bible RV1909-WEB", "bible-rv1909-web"),
    ],
)
def test_dataset_ids_are_hub_ids_or_name_slugs(spec, name, expected):
    card = ModelCard(_render(RNNSeq2SeqConfig(**RNN), _metrics(spec=spec, name=name)))
    assert card.data.datasets == [expected]
    assert {result.dataset_type for result in card.data.eval_results} == {expected}


def test_public_spec_drops_local_folders():
    assert public_spec("text:/home/me/d/train.de,/home/me/d/train.en") == "text:train.de,train.en"
    assert public_spec("multi30k:/data/multi30k/") == "multi30k:multi30k"
    assert public_spec("hf:bentrevett/multi30k") == "hf:bentrevett/multi30k"
    assert public_spec("bible:es-en") == "bible:es-en"


def test_card_without_metrics_or_recipe_is_still_valid():
    text = _render(TransformerSeq2SeqConfig(**TRANSFORMER), metrics=None, license="mit")
    card = ModelCard(text)
    assert card.data.license == "mit"
    assert card.data.eval_results is None and "model-index" not in card.data.to_dict()
    assert "No test-set evaluation was recorded" in card.text
    assert "![" not in card.text  # no heat-map given, no image link


def test_card_hyperparameter_table_leaves_out_the_trainers_debug_fields():
    recipe = {
        "learning_rate": 0.001,
        "debug_dump_batches": False,
        "debug_crash_at_step": None,
        "model_config": {"dropout": 0.3},
    }
    text = ModelCard(_render(RNNSeq2SeqConfig(**RNN), _metrics(), recipe=recipe)).text
    assert "| `learning_rate` | `0.001` |" in text and "| `model_config.dropout` | `0.3` |" in text
    assert "debug_" not in text


def test_card_shows_recipe_heatmap_and_usage():
    recipe = {"model": {"hidden_size": 256, "attention": "luong"}, "optim": {"lr": 0.001, "warmup_steps": 4000}}
    text = ModelCard(_render(RNNSeq2SeqConfig(**RNN), _metrics(), recipe=recipe, heatmap="attention_heatmap.png")).text
    assert "| `model.hidden_size` | `256` |" in text and "| `optim.lr` | `0.001` |" in text
    assert "![Cross-attention of a test sentence](attention_heatmap.png)" in text
    assert 'pipeline("translation", model="someone/tiny-model", revision=REVISION, trust_remote_code=True)' in text
    load = 'AutoModelForSeq2SeqLM.from_pretrained("someone/tiny-model", revision=REVISION, trust_remote_code=True)'
    assert load in text
    assert "Seq2SeqTrainer(" in text and "return_attention=True" in text
    assert "num_beams=5" in text


def test_card_shows_bootstrap_intervals_when_evaluate_recorded_them():
    plain = ModelCard(_render(RNNSeq2SeqConfig(**RNN), _metrics())).text
    assert "| 35.42 | 61.02 |" in plain and "bootstrap" not in plain
    metrics = _metrics()
    metrics["test"]["test2016"].update(bleu_ci95=1.614, chrf_ci95=1.2)
    text = ModelCard(_render(RNNSeq2SeqConfig(**RNN), metrics)).text
    assert "| 35.42 ± 1.61 | 61.02 ± 1.20 |" in text and "| 36.50 | 62.25 |" in text
    assert "95% bootstrap confidence interval" in text


def test_bad_input_fails_with_a_clear_error():
    with pytest.raises(ModelCardError, match=r"model_card\.md: no value for the slot \{\{ title \}\}"):
        fill("# {{ title }}", {}, "model_card.md")
    metrics = _metrics()
    del metrics["test"]["val"]["chrf"]
    with pytest.raises(ModelCardError, match="test set 'val' has no 'chrf' score"):
        _render(RNNSeq2SeqConfig(**RNN), metrics)


def test_the_recorded_preset_decides_the_corpus_terms_not_words_in_the_spec():
    # metrics.json written since corpus.preset exists: the card reads the preset and guesses nothing
    tatoeba = _metrics(spec="tatoeba:/data/pairs:zh-en", name="My pairs", src="zh", tgt="en", license="CC-BY 2.0 FR")
    tatoeba["corpus"]["preset"] = "tatoeba"
    card = ModelCard(_render(RNNSeq2SeqConfig(**RNN), tatoeba))
    assert card.data.license == "cc-by-2.0" and "Attribution: www.manythings.org/anki and tatoeba.org" in card.text
    # a corpus read as plain tsv is no preset, whatever its file is called
    plain = _metrics(spec="tsv:/data/cmn-eng/train.tsv", name="cmn pairs", src="zh", tgt="en", license="CC0")
    plain["corpus"]["preset"] = None
    card = ModelCard(_render(RNNSeq2SeqConfig(**RNN), plain))
    assert card.data.license == "apache-2.0" and "`tsv:train.tsv` (cmn pairs)" in card.text
    assert "manythings" not in card.text


def test_a_setting_without_its_own_card_section_still_renders(monkeypatch):
    # e.g. a new Luong score added to the config before hub_cards/rnn_seq2seq.md has a section for it
    from attention_seq2seq.hub import model_card

    real_sections = model_card.template_sections

    def without_score_sections(name):
        return {k: v for k, v in real_sections(name).items() if not k.startswith("score-")}

    monkeypatch.setattr(model_card, "template_sections", without_score_sections)
    config = RNNSeq2SeqConfig(**{**RNN, "attention": "luong", "score": "general"})
    text = ModelCard(_render(config, _metrics())).text
    assert "Score function: `general`." in text
