"""The attention explorer's computations (attention/explorer.py), its heat-maps
(attention_seq2seq/explorer_app.py), its bertviz adapter and the Space files of ``export --space``,
without a browser (test_explorer_browser.py drives the app).

Models: the tiny trained runs of tests/helpers.py, and untrained tiny RNNs of every attention
variant (seeded), whose weights are as good as trained ones for checking what is shown against
what the model computes."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import FAMILIES, build_tiny_run, tiny_tokenizer

from attention_seq2seq.attention.bertviz_adapter import bertviz_inputs
from attention_seq2seq.attention.explorer import (
    ALL_STEPS,
    CROSS,
    DECODER_SELF,
    ENCODER_SELF,
    MEAN_OVER_HEADS,
    WORDS,
    Explanation,
    HeatMap,
    explain,
    select,
    to_words,
    word_groups,
)
from attention_seq2seq.explorer_app import heatmap_html, render_attention
from attention_seq2seq.translation.loading import load_for_inference

SOURCE = "Y dijo Dios: Sea la luz."

# Every attention of the RNN family (configuration_rnn_seq2seq.py), small enough to build at once.
RNN_VARIANTS = {
    "bahdanau": dict(attention="bahdanau"),
    "bahdanau-coverage": dict(attention="bahdanau", coverage=True),
    "luong-general": dict(attention="luong", score="general"),
    "luong-dot-no-feeding": dict(attention="luong", score="dot", input_feeding=False),
    "luong-concat": dict(attention="luong", score="concat"),
    "luong-local-m": dict(attention="luong", score="general", window="local-m", window_size=2),
    "luong-local-p": dict(attention="luong", score="general", window="local-p", window_size=2),
    "luong-hard": dict(attention="luong", score="general", attention_mode="hard"),
    "none": dict(attention="none"),
}


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("explorer-runs")


@pytest.fixture(scope="module", params=FAMILIES)
def trained(request, runs_root):
    return load_for_inference(build_tiny_run(request.param, runs_root), device="cpu", attn_implementation="eager")


@pytest.fixture(scope="module")
def tokenizer(runs_root):
    return tiny_tokenizer(runs_root)


def rnn_model(tokenizer, variant: str):
    from attention_seq2seq import RNNSeq2SeqConfig, RNNSeq2SeqForConditionalGeneration

    torch.manual_seed(0)
    config = RNNSeq2SeqConfig(
        vocab_size=len(tokenizer), embedding_size=16, hidden_size=16, dropout=0.0, **RNN_VARIANTS[variant]
    )
    model = RNNSeq2SeqForConditionalGeneration(config).eval()
    model.generation_config.max_new_tokens = 8
    return model


def _labels(e: Explanation, tokenizer) -> torch.Tensor:
    return torch.tensor([tokenizer.convert_tokens_to_ids(e.tgt_tokens)])


def _expected_attentions(model, tokenizer, e: Explanation):
    encoded = tokenizer([e.source], return_tensors="pt")
    with torch.no_grad():
        return model(**encoded, labels=_labels(e, tokenizer), output_attentions=True)


# ---------------------------------------------------------------------------------------------
# explain: the translation is generate's, the weights are output_attentions'


@pytest.mark.parametrize("num_beams, length_penalty", [(1, None), (3, 0.5)])
def test_explain_gives_generates_translation_and_the_models_attentions(trained, num_beams, length_penalty):
    model, tokenizer = trained.model, trained.tokenizer
    e = explain(model, tokenizer, SOURCE, num_beams=num_beams, length_penalty=length_penalty)
    encoded = tokenizer([SOURCE], return_tensors="pt")
    kwargs = {"num_beams": num_beams, "do_sample": False}
    if length_penalty is not None:
        kwargs["length_penalty"] = length_penalty
    with torch.no_grad():
        generated = model.generate(**encoded, **kwargs)
    assert e.translation == tokenizer.decode(generated[0], skip_special_tokens=True).strip()
    assert e.candidates[0][0] == e.translation and len(e.candidates) == num_beams
    if num_beams > 1:
        scores = [score for _, score in e.candidates]
        assert scores == sorted(scores, reverse=True)

    expected = _expected_attentions(model, tokenizer, e)
    assert e.cross.shape[:2] == (len(expected.cross_attentions), expected.cross_attentions[0].shape[1])
    for layer, weights in enumerate(expected.cross_attentions):
        torch.testing.assert_close(torch.from_numpy(e.cross[layer]), weights[0])
    if model.config.model_type == "transformer_seq2seq":
        for mine, theirs in (
            (e.encoder_self, expected.encoder_attentions),
            (e.decoder_self, expected.decoder_attentions),
        ):
            for layer, weights in enumerate(theirs):
                torch.testing.assert_close(torch.from_numpy(mine[layer]), weights[0])
        assert len(e.decoder_tokens) == len(e.tgt_tokens) == e.decoder_self.shape[-1]
    else:
        assert e.encoder_self is None and e.decoder_self is None
    # Greedy's score is log p(y | x) of the translation, from the same forward pass.
    if num_beams == 1:
        log_probs = torch.log_softmax(expected.logits[0], -1)
        labels = _labels(e, tokenizer)[0]
        assert e.candidates[0][1] == pytest.approx(float(log_probs[torch.arange(len(labels)), labels].sum()), abs=1e-4)


def test_teacher_forced_target_and_empty_source(trained):
    e = explain(trained.model, trained.tokenizer, SOURCE, target="And there was light.")
    assert e.translation == "And there was light."
    assert e.tgt_tokens == trained.tokenizer.convert_ids_to_tokens(
        trained.tokenizer(text_target=["And there was light."])["input_ids"][0]
    )
    with pytest.raises(ValueError, match="source sentence is empty"):
        explain(trained.model, trained.tokenizer, "  ")


@pytest.mark.parametrize("variant", sorted(RNN_VARIANTS))
def test_every_rnn_attention_variant_is_explained(tokenizer, variant):
    model = rnn_model(tokenizer, variant)
    e = explain(model, tokenizer, SOURCE)
    with torch.no_grad():
        generated = model.generate(**tokenizer([SOURCE], return_tensors="pt"), num_beams=1, do_sample=False)
    assert e.translation == tokenizer.decode(generated[0], skip_special_tokens=True).strip()
    if variant == "none":
        assert e.cross is None
        page = render_attention(model.config, e.to_json())
        assert "no attention to show" in page and "attn-map" not in page
        with pytest.raises(ValueError, match="attention='none'"):
            bertviz_inputs(model, tokenizer, SOURCE)
        return
    expected = _expected_attentions(model, tokenizer, e).cross_attentions
    assert e.cross.shape == (1, 1, len(e.tgt_tokens), len(e.src_tokens))
    torch.testing.assert_close(torch.from_numpy(e.cross[0]), expected[0][0])
    src_len = len(e.src_tokens)
    if "local" in variant:
        d = model.config.window_size
        p = e.aligned_positions
        assert e.window_size == d and p.shape == (len(e.tgt_tokens),)
        if variant == "luong-local-m":
            # Luong et al. (2015), §3.2: p_t = t, clamped to the last source position.
            np.testing.assert_array_equal(p, np.minimum(np.arange(len(p)), src_len - 1))
        else:
            assert ((0 <= p) & (p <= src_len)).all()  # p_t = S · sigmoid(...) (eq. 9)
        # Every weight outside [p_t - D, p_t + D] is zero: the p_t shown is the one the model used.
        positions = np.arange(src_len)
        outside = np.abs(positions[None, :] - p[:, None]) > d
        assert (e.cross[0, 0][outside] == 0).all() and (e.cross[0, 0][~outside] > 0).any()
        page = heatmap_html(select(e))
        assert page.count('class="in-window') == int((~outside).sum())
        assert "aligned position p_t" in page
    else:
        assert e.aligned_positions is None
    if variant == "luong-hard":
        rows = e.cross[0, 0]
        assert ((rows == 0) | (rows == 1)).all() and (rows.sum(-1) == 1).all()
        heatmap = select(e)
        assert heatmap.marks["chosen"] == rows.argmax(-1).tolist()
        assert heatmap_html(heatmap).count("●") == len(e.tgt_tokens)


def test_windows_of_an_rnn_step(tokenizer):
    model = rnn_model(tokenizer, "luong-local-p")
    e = explain(model, tokenizer, SOURCE)
    one = select(e, step=2)
    np.testing.assert_array_equal(one.weights, e.cross[0, 0, 2:3])
    assert one.row_labels == [e.tgt_tokens[2]] and one.marks["center"] == [pytest.approx(float(e.aligned_positions[2]))]
    page = render_attention(model.config, e.to_json(), CROSS, None, None, "subwords", "3")
    np.testing.assert_allclose(json.loads(_attribute(page, "data-weights")), e.cross[0, 0, 2:3], atol=1e-6)
    assert "step 3" in page


# ---------------------------------------------------------------------------------------------
# Pickers: layer, head, mean over heads, words


def _attribute(page: str, name: str) -> str:
    import html

    return html.unescape(re.search(rf'{name}="([^"]*)"', page).group(1))


def test_heatmap_html_holds_the_plotted_array_and_labels():
    weights = np.array([[0.25, 0.75], [1.0, 0.0]], dtype=np.float32)
    page = heatmap_html(HeatMap(weights, ["▁我", "</s>"], ['"a"', "<b>"], "t"))
    assert json.loads(_attribute(page, "data-weights")) == [[0.25, 0.75], [1.0, 0.0]]
    assert json.loads(_attribute(page, "data-rows")) == ["▁我", "</s>"]
    assert json.loads(_attribute(page, "data-cols")) == ['"a"', "<b>"]
    assert "&lt;b&gt;" in page and "<b>" not in page  # labels are escaped
    assert page.count("<td") == 4
    assert "Noto Sans CJK" in page  # the fonts.py fallback list, as CSS


def test_transformer_pickers_select_layer_head_and_mean(runs_root):
    trained = load_for_inference(
        build_tiny_run("transformer_seq2seq", runs_root), device="cpu", attn_implementation="eager"
    )
    e = explain(trained.model, trained.tokenizer, SOURCE)
    data = e.to_json()
    pages = {}
    for head in ("1", "2", MEAN_OVER_HEADS):
        page = render_attention(trained.model.config, data, CROSS, "1", head, "subwords", ALL_STEPS)
        pages[head] = np.array(json.loads(_attribute(page, "data-weights")))
    np.testing.assert_allclose(pages["1"], e.cross[0, 0], atol=1e-6)
    np.testing.assert_allclose(pages["2"], e.cross[0, 1], atol=1e-6)
    np.testing.assert_allclose(pages[MEAN_OVER_HEADS], e.cross[0].mean(0), atol=1e-6)
    assert not np.allclose(pages["1"], pages["2"])
    for view, array, labels in (
        (ENCODER_SELF, e.encoder_self, e.src_tokens),
        (DECODER_SELF, e.decoder_self, e.decoder_tokens),
    ):
        page = render_attention(trained.model.config, data, view, "1", "2", "subwords", ALL_STEPS)
        np.testing.assert_allclose(json.loads(_attribute(page, "data-weights")), array[0, 1], atol=1e-6)
        assert json.loads(_attribute(page, "data-rows")) == labels
    round_trip = Explanation.from_json(json.loads(json.dumps(data)))
    np.testing.assert_array_equal(round_trip.cross, e.cross)


def test_subwords_group_into_words_by_hand():
    tokens = ["▁Ein", "▁Hund", "e", "s", "▁lä", "uft", ".", "</s>"]
    assert word_groups(tokens, {"</s>"}) == [("Ein", [0]), ("Hundes", [1, 2, 3]), ("läuft.", [4, 5, 6]), ("</s>", [7])]
    weights = np.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [1.0, 0.0, 0.0, 0.0]])
    rows = [("A", [0, 1]), ("B", [2])]
    cols = [("x", [0]), ("y", [1, 2]), ("z", [3])]
    # A source word gets the sum of its subwords' weights; a target word the mean of its rows.
    expected = np.array([[(0.1 + 0.4) / 2, (0.5 + 0.5) / 2, (0.4 + 0.1) / 2], [1.0, 0.0, 0.0]])
    np.testing.assert_allclose(to_words(weights, rows, cols), expected)


def test_word_view_rows_stay_distributions(trained):
    e = explain(trained.model, trained.tokenizer, SOURCE)
    words = select(e, CROSS, -1, MEAN_OVER_HEADS, WORDS)
    np.testing.assert_allclose(words.weights.sum(-1), 1.0, atol=1e-5)
    assert "".join(words.col_labels).replace("</s>", "") == "".join(t.lstrip("▁") for t in e.src_tokens if t != "</s>")
    # One decoder step in the word view: the row of the word that step's subword belongs to.
    groups = word_groups(e.tgt_tokens, e.special_tokens)
    for step in range(len(e.tgt_tokens)):
        word = next(k for k, (_, indices) in enumerate(groups) if step in indices)
        one = select(e, CROSS, -1, MEAN_OVER_HEADS, WORDS, step=step)
        assert one.row_labels == [words.row_labels[word]]
        np.testing.assert_array_equal(one.weights, words.weights[word : word + 1])


# ---------------------------------------------------------------------------------------------
# bertviz adapter: the structure model_view / head_view read


def _as_bertviz_reads(inputs: dict) -> list[dict]:
    """What bertviz 1.4's model_view does with its encoder-decoder arguments (bertviz/util.py
    format_attention: every layer (1, num_heads, q, k), squeezed and stacked per part)."""
    parts = []
    for name, key, left, right in (
        ("Encoder", "encoder_attention", "encoder_tokens", "encoder_tokens"),
        ("Decoder", "decoder_attention", "decoder_tokens", "decoder_tokens"),
        ("Cross", "cross_attention", "decoder_tokens", "encoder_tokens"),
    ):
        if inputs.get(key) is None:
            continue
        layers = inputs[key]
        assert isinstance(layers, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in layers)
        assert all(t.dim() == 4 and t.size(0) == 1 for t in layers)
        stacked = torch.stack([t.squeeze(0) for t in layers])  # (num_layers, num_heads, q, k)
        assert stacked.shape[2:] == (len(inputs[left]), len(inputs[right]))
        parts.append({"name": name, "attn": stacked.tolist(), "left_text": inputs[left], "right_text": inputs[right]})
    return parts


def test_bertviz_inputs_have_bertvizs_encoder_decoder_structure(trained):
    inputs = bertviz_inputs(trained.model, trained.tokenizer, SOURCE)
    parts = _as_bertviz_reads(inputs)
    e = explain(trained.model, trained.tokenizer, SOURCE)
    expected_names = ["Encoder", "Decoder", "Cross"] if trained.family == "transformer_seq2seq" else ["Cross"]
    assert [p["name"] for p in parts] == expected_names
    assert set(inputs) <= {
        "encoder_attention",
        "decoder_attention",
        "cross_attention",
        "encoder_tokens",
        "decoder_tokens",
    }
    np.testing.assert_allclose(np.array(parts[-1]["attn"]), e.cross, atol=1e-7)
    assert inputs["decoder_tokens"][1:] == e.tgt_tokens[:-1]
    try:
        from bertviz import head_view, model_view
    except ImportError:
        return  # bertviz is not a dependency; the structure above is its documented input
    assert "Cross" in model_view(**inputs, html_action="return").data
    assert head_view(**inputs, html_action="return").data


# ---------------------------------------------------------------------------------------------
# export --space


ALLOWED_IN_SPACE = {"gradio", "numpy", "torch", "transformers", "attention_explorer"}


def test_space_files_import_only_the_hub_packages(runs_root, tmp_path, capsys):
    from attention_seq2seq.cli import main

    run = build_tiny_run("rnn_seq2seq", runs_root)
    assert main(["export", str(run), "--output", str(tmp_path / "export"), "--space", "--repo-id", "me/rnn"]) == 0
    folder = tmp_path / "export"
    requirements = (folder / "requirements.txt").read_text().split()
    assert sorted(r.split(">")[0].split("=")[0] for r in requirements) == ["gradio", "torch", "transformers"]
    for name in ("app.py", "explorer_app.py", "explorer.py", "fonts.py", "sentences.py", "attention_pass.py"):
        tree = ast.parse((folder / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                tops = {node.module.split(".")[0]}
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 1 and (folder / f"{node.module}.py").is_file(), (name, node.module)
                continue
            else:
                continue
            assert tops <= ALLOWED_IN_SPACE | set(sys.stdlib_module_names) | {"matplotlib"}, (name, tops)
    assert json.loads((folder / "space.json").read_text()) == {"model": "me/rnn"}


_SPACE_WITHOUT_PACKAGE = r"""
import json, sys
sys.modules["attention_seq2seq"] = None  # the package must not be needed (nor found) here
folder = sys.argv[1]
sys.path.insert(0, folder)  # what `python app.py` does
import app
model, tokenizer = app.load_model(folder)
e = app.explain(model, tokenizer, sys.argv[2])
app.build_app(model, tokenizer)  # the Gradio app builds too
print(json.dumps({"translation": e.translation, "cross": e.cross.tolist()}))
"""


def test_space_app_runs_without_the_package_and_translates_the_same(runs_root, tmp_path):
    from attention_seq2seq.hub.export import export_model

    run = build_tiny_run("transformer_seq2seq", runs_root)
    folder = export_model(run, tmp_path / "space", space=True)
    result = subprocess.run(
        [sys.executable, "-c", _SPACE_WITHOUT_PACKAGE, str(folder), SOURCE],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    shown = json.loads(result.stdout.strip().splitlines()[-1])
    loaded = load_for_inference(run, device="cpu", attn_implementation="eager")
    expected = explain(loaded.model, loaded.tokenizer, SOURCE)
    assert shown["translation"] == expected.translation
    np.testing.assert_allclose(np.array(shown["cross"]), expected.cross, atol=1e-6)


def test_demo_without_gradio_or_with_a_missing_model_says_so_in_one_line(runs_root, monkeypatch, capsys):
    from attention_seq2seq.cli import main

    assert main(["demo", "-m", str(runs_root / "nope")]) == 2
    assert "model folder not found" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "gradio", None)  # as if the demo extra were not installed
    assert main(["demo", "-m", str(build_tiny_run("rnn_seq2seq", runs_root))]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "attention-seq2seq demo: error: the demo needs gradio: pip install 'attention-seq2seq[demo]'"
