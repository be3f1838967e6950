"""Terminology constraints (translation/constraints.py): lexically constrained beam search with
dynamic beam allocation (Post & Vilar 2018), through generate's custom_generate, for both model
families and ensembles; the exported custom_generate/ folder; the constraints file."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

from attention_seq2seq import RNNSeq2SeqConfig, TransformerSeq2SeqConfig
from attention_seq2seq.common.errors import UserError
from attention_seq2seq.translation.ensemble import EnsembleForConditionalGeneration
from attention_seq2seq.translation import constraints as constraints_module
from attention_seq2seq.translation.constraints import (
    SentenceConstraints,
    _bank_sizes,
    constrained_beam_search,
    constrained_decoding,
)
from attention_seq2seq.hub.export import write_custom_generate
from attention_seq2seq.translation.files import read_constraints_file

VOCAB = 24  # 0 <pad>, 1 <s>, 2 </s>, 3 <unk>, 4..23 the words w4..w23
PAD, EOS = 0, 2
SPECIAL = dict(vocab_size=VOCAB, pad_token_id=PAD, bos_token_id=1, eos_token_id=EOS, decoder_start_token_id=1)
FAMILIES = ("transformer", "rnn")


def _build(family: str, seed: int = 0):
    torch.manual_seed(seed)
    if family == "transformer":
        config = TransformerSeq2SeqConfig(
            d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0, **SPECIAL,
        )  # fmt: skip
    else:
        config = RNNSeq2SeqConfig(embedding_size=32, hidden_size=64, dropout=0.0, **SPECIAL)
    return AutoModelForSeq2SeqLM.from_config(config)


def _copy_batch(rng: random.Random, n: int):
    """A copy task: the target is the source (3 to 7 words), then </s>."""
    sources = [[rng.randrange(4, VOCAB) for _ in range(rng.randint(3, 7))] for _ in range(n)]
    width = max(map(len, sources))
    input_ids = torch.tensor([s + [PAD] * (width - len(s)) for s in sources])
    labels = torch.tensor([s + [EOS] + [-100] * (width - len(s)) for s in sources])
    return input_ids, (input_ids != PAD).long(), labels


@pytest.fixture(scope="module")
def trained():
    """One model per family trained for 600 updates to copy its source (about 8 s each). 300 left
    a loss of 0.11-0.13 on an AMD EPYC (0.006-0.02 after 600): a model that had not quite learned
    to stop let forced words push it into repeating, and 5 of the constraint cases failed there."""
    models = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for family in FAMILIES:
            model = _build(family).train()
            optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
            rng = random.Random(0)
            for _ in range(600):
                input_ids, attention_mask, labels = _copy_batch(rng, 32)
                loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            models[family] = model.eval()
    finally:
        torch.set_num_threads(threads)
    return models


def _sources(*rows):
    width = max(map(len, rows))
    input_ids = torch.tensor([list(r) + [PAD] * (width - len(r)) for r in rows])
    return input_ids, (input_ids != PAD).long()


def _strip(row) -> list[int]:
    """A returned row without its start token, up to and with its first </s>, padding dropped
    (transformers' beam search fills a finished row with </s> when pad_token_id is 0)."""
    tokens = row.tolist()[1:]
    return tokens[: tokens.index(EOS) + 1] if EOS in tokens else [t for t in tokens if t != PAD]


def _contains(tokens: list[int], phrase: list[int]) -> bool:
    return any(tokens[k : k + len(phrase)] == phrase for k in range(len(tokens) - len(phrase) + 1))


# ---------------------------------------------------------------------------- the constraint state


def test_progress_into_a_phrase_is_lost_when_abandoned_and_shared_prefixes_are_followed():
    sentence = SentenceConstraints([[5, 6, 7], [5, 8]])
    state = sentence.start
    state = sentence.advance(state, 5)  # both phrases begun
    assert state == (1, 1) and sentence.met_tokens(state) == 1 and sentence.next_tokens(state) == {6, 8}
    state = sentence.advance(state, 6)
    assert state == (2, 0) and sentence.met_tokens(state) == 2
    state = sentence.advance(state, 9)  # abandoned: the progress is lost
    assert state == (0, 0) and sentence.met_tokens(state) == 0
    for token in (5, 8):  # "5 8" shares "5" with "5 6 7" and is still recognised
        state = sentence.advance(state, token)
    assert state == (0, -1) and sentence.met_tokens(state) == 2 and not sentence.all_met(state)
    for token in (5, 6, 7):
        state = sentence.advance(state, token)
    assert sentence.all_met(state) and sentence.met_tokens(state) == sentence.total == 5


def test_a_phrase_with_a_repeated_prefix_is_found_after_a_false_start():
    sentence = SentenceConstraints([[5, 5, 6], [5, 5, 6]])  # a repeat counts once
    assert sentence.phrases == ((5, 5, 6),)
    state = sentence.start
    for token in (5, 5, 5, 6):  # "5 5 | 5 6": the third 5 falls back to progress 2, not 0
        state = sentence.advance(state, token)
    assert sentence.all_met(state)


def test_bank_sizes_share_the_beam_and_pass_unused_slots_down():
    assert _bank_sizes(4, [9]) == [4]
    assert _bank_sizes(6, [9, 9, 9]) == [2, 2, 2]
    assert _bank_sizes(7, [9, 9, 9]) == [2, 2, 3]  # the remainder to the top bank
    assert _bank_sizes(6, [9, 9, 0]) == [2, 4, 0]  # the empty top bank gives its slots down
    assert _bank_sizes(4, [9, 1, 1, 0, 0]) == [2, 1, 1, 0, 0]  # more banks than slots


# ---------------------------------------------------------------------------- without constraints


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "decoding",
    [
        dict(num_beams=4),
        dict(num_beams=4, num_return_sequences=3, length_penalty=0.6),
        dict(num_beams=2),
        dict(num_beams=3, early_stopping=True),
        dict(num_beams=3, early_stopping="never", length_penalty=1.2, no_repeat_ngram_size=2),
    ],
    ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()),
)
def test_without_constraints_it_is_plain_beam_search(trained, family, decoding):
    """Every sentence without constraints: the same hypotheses and scores as generate(num_beams=k)
    (the trained model, whose beams finish at </s> at different lengths, and an untrained one,
    whose beams run to the length limit)."""
    rng = random.Random(3)
    input_ids, attention_mask, _ = _copy_batch(rng, 6)
    for model in (trained[family], _build(family, seed=2).eval()):
        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10)
        plain = model.generate(**kwargs, **decoding, output_scores=True, return_dict_in_generate=True)
        got = model.generate(
            **kwargs, **decoding, custom_generate=constrained_decoding, constraints=[[] for _ in range(6)],
            output_scores=True, return_dict_in_generate=True,
        )  # fmt: skip
        assert [_strip(r) for r in got.sequences] == [_strip(r) for r in plain.sequences]
        assert torch.equal(got.sequences_scores, plain.sequences_scores)
        assert got.sequences.shape == plain.sequences.shape
        # padded with pad_token_id after </s>
        for row in got.sequences.tolist():
            if EOS in row:
                assert set(row[row.index(EOS) + 1 :]) <= {PAD}
    # constraints=None and the function route too
    best = constrained_beam_search(trained[family], input_ids, attention_mask, None, 4, 10)
    plain = trained[family].generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10, num_beams=4)
    assert [_strip(r) for r in best] == [_strip(r) for r in plain]


# ---------------------------------------------------------------------------- with constraints

CASES = {
    "one token": [[20]],
    "a phrase": [[20, 21, 22]],
    "two constraints": [[20], [22, 23]],
    "a shared prefix": [[20, 21], [20, 22]],
    "a repeated prefix": [[9, 9, 10]],
    "already in the source": [[6, 7]],
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_every_returned_hypothesis_contains_every_constraint(trained, family, case):
    model = trained[family]
    input_ids, attention_mask = _sources([5, 6, 7, 8], [11, 12, 13, 14, 15, 16])
    phrases = CASES[case]
    out = constrained_beam_search(
        model, input_ids, attention_mask, [phrases, phrases], num_beams=5, max_new_tokens=16, num_return_sequences=3
    )
    assert out.shape[0] == 6
    for row in out:
        tokens = _strip(row)
        assert tokens[-1] == EOS, f"{tokens} did not finish"
        for phrase in phrases:
            assert _contains(tokens, phrase), f"{phrase} missing from {tokens}"
    if case == "already in the source":  # met by the plain translation (the copy): nothing changes
        plain = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=5, max_new_tokens=16)
        assert _strip(out[0]) == _strip(plain[0]) == [5, 6, 7, 8, EOS]
    else:  # the copy model keeps copying, in order, the source words the forced ones leave
        best = _strip(out[0])
        kept = [t for t in best if t in (5, 6, 7, 8)]
        assert len(kept) >= 2 and kept == sorted(kept), best


@pytest.mark.parametrize("family", FAMILIES)
def test_a_batch_decodes_as_its_sentences_one_at_a_time(trained, family):
    model = trained[family]
    rows = [[5, 6, 7, 8], [11, 12, 13, 14, 15, 16, 17], [9, 10, 4]]
    constraints = [[[20]], [], [[21, 22], [9]]]
    input_ids, attention_mask = _sources(*rows)
    kwargs = dict(num_beams=4, max_new_tokens=14, num_return_sequences=2)
    together = constrained_beam_search(model, input_ids, attention_mask, constraints, **kwargs)
    for i, (row, phrases) in enumerate(zip(rows, constraints)):
        alone = constrained_beam_search(model, torch.tensor([row]), torch.ones(1, len(row)), [phrases], **kwargs)
        assert [_strip(r) for r in alone] == [_strip(r) for r in together[2 * i : 2 * i + 2]]
    # the unconstrained sentence is plain beam search also inside a constrained batch
    plain = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    assert [_strip(r) for r in together[2:4]] == [_strip(r) for r in plain[2:4]]


@pytest.mark.parametrize("family", FAMILIES)
def test_caches_follow_the_beams_as_decoding_without_a_cache(trained, family):
    model = trained[family]
    input_ids, attention_mask = _sources([5, 6, 7, 8], [11, 12, 13])
    constraints = [[[20, 21]], [[22], [23]]]
    kwargs = dict(num_beams=4, max_new_tokens=12, num_return_sequences=2)
    with_cache = constrained_beam_search(model, input_ids, attention_mask, constraints, **kwargs)
    without = constrained_beam_search(model, input_ids, attention_mask, constraints, use_cache=False, **kwargs)
    assert torch.equal(with_cache, without)


def test_generate_with_the_callable_equals_the_function(trained):
    model = trained["transformer"]
    input_ids, attention_mask = _sources([5, 6, 7, 8])
    by_function = constrained_beam_search(model, input_ids, attention_mask, [[[20]]], 3, 10)
    by_generate = model.generate(
        input_ids, attention_mask=attention_mask, custom_generate=constrained_decoding, constraints=[[[20]]],
        num_beams=3, max_new_tokens=10,
    )  # fmt: skip
    assert torch.equal(by_function, by_generate)


def test_ensembles_decode_with_constraints(trained):
    input_ids, attention_mask = _sources([5, 6, 7, 8], [11, 12, 13, 14])
    constraints = [[[20], [21, 22]], [[23]]]
    kwargs = dict(num_beams=4, max_new_tokens=14, num_return_sequences=2)
    for family in FAMILIES:
        alone = constrained_beam_search(trained[family], input_ids, attention_mask, constraints, **kwargs)
        one = EnsembleForConditionalGeneration([trained[family]])
        got = constrained_beam_search(one, input_ids, attention_mask, constraints, **kwargs)
        assert [_strip(r) for r in got] == [_strip(r) for r in alone]
    mixed = EnsembleForConditionalGeneration([trained["transformer"], trained["rnn"]])
    out = constrained_beam_search(mixed, input_ids, attention_mask, constraints, **kwargs)
    for n, row in enumerate(out):
        tokens = _strip(row)
        assert tokens[-1] == EOS and all(_contains(tokens, p) for p in constraints[n // 2]), tokens


def test_constraints_too_long_together_return_the_hypotheses_that_met_the_most(trained, caplog):
    input_ids, attention_mask = _sources([5, 6, 7, 8])
    with caplog.at_level(logging.WARNING):
        out = constrained_beam_search(
            trained["transformer"], input_ids, attention_mask, [[[20, 21, 22], [23, 4, 9]]], 4, max_new_tokens=4
        )
    assert "no hypothesis of sentence 0 met every constraint within max_new_tokens=4" in caplog.text
    tokens = out[0].tolist()[1:]
    assert _contains(tokens, [20, 21, 22]) or _contains(tokens, [23, 4, 9])


# ---------------------------------------------------------------------------- refused constraints


def test_a_constraint_longer_than_max_new_tokens_is_refused_in_one_line(trained):
    input_ids, attention_mask = _sources([5, 6, 7], [8, 9])
    message = r"^sentence 1: constraint \[20, 21, 22, 23, 4\] has 5 tokens but max_new_tokens=4"
    with pytest.raises(ValueError, match=message) as error:
        constrained_beam_search(trained["rnn"], input_ids, attention_mask, [[[20]], [[20, 21, 22, 23, 4]]], 3, 4)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "constraints, message",
    [
        ([[[20]], [[]]], r"sentence 1: constraint 0 is an empty phrase"),
        ([[[20]]], r"constraints has 1 entries for 2 source sentence\(s\)"),
        ([[[20, EOS]], []], r"sentence 0: constraint \[20, 2\] contains the end-of-sentence token 2"),
        ([[], [[99]]], r"sentence 1: constraint \[99\] has token id 99, outside the vocabulary \(0..23\)"),
        ([["w20"], []], r"sentence 0: constraint 0 must be a list of token ids"),
    ],
)
def test_bad_constraints_are_refused_before_decoding(trained, constraints, message):
    input_ids, attention_mask = _sources([5, 6, 7], [8, 9])
    with pytest.raises(ValueError, match=message):
        constrained_beam_search(trained["transformer"], input_ids, attention_mask, constraints, 3, 8)


# ---------------------------------------------------------------------------- the constraints file


def _word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, VOCAB)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def test_read_constraints_file_gives_one_list_of_phrases_per_source_line(tmp_path):
    tokenizer = _word_tokenizer()
    path = tmp_path / "terms.tsv"
    path.write_text("w20\tw21 w22\n\n w9 \r\n", encoding="utf-8")
    assert read_constraints_file(path, tokenizer, 3) == [[[20], [21, 22]], [], [[9]]]
    with pytest.raises(UserError, match=r"terms.tsv has 3 line\(s\) but the source has 4"):
        read_constraints_file(path, tokenizer, 4)
    path.write_text("w20\t\tw21\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"terms.tsv:1: an empty constraint"):
        read_constraints_file(path, tokenizer, 1)
    with pytest.raises(UserError, match="cannot read the constraints file"):
        read_constraints_file(tmp_path / "missing.tsv", tokenizer, 1)


def test_read_constraints_file_feeds_the_search(trained, tmp_path):
    path = tmp_path / "terms.tsv"
    path.write_text("w20 w21\n\n", encoding="utf-8")
    constraints = read_constraints_file(path, _word_tokenizer(), 2)
    input_ids, attention_mask = _sources([5, 6, 7, 8], [11, 12, 13])
    out = constrained_beam_search(trained["rnn"], input_ids, attention_mask, constraints, 4, 12)
    assert _contains(_strip(out[0]), [20, 21]) and _strip(out[1]) == [11, 12, 13, EOS]


# ---------------------------------------------------------------------------- custom_generate/ on the Hub route


def test_the_shipped_generate_py_imports_only_torch_and_transformers(tmp_path):
    import ast

    write_custom_generate(tmp_path)
    shipped = (tmp_path / "custom_generate" / "generate.py").read_text(encoding="utf-8")
    tree = ast.parse(shipped)
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import"
            imported.add(node.module.split(".")[0])
    assert imported <= {"__future__", "struct", "torch", "transformers"}, imported
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert {"generate", "constrained_decoding", "constrained_beam_search"} <= names
    # one implementation: the shipped text is this module's own
    assert shipped == open(constraints_module.__file__, encoding="utf-8").read()


_CUSTOM_GENERATE_CHILD = r"""
import functools, json, sys
sys.modules["attention_seq2seq"] = None  # the package must not be needed (nor found) here
import torch
from transformers import AutoModelForSeq2SeqLM

args = json.loads(sys.argv[1])
results = {}
for name, folder in args["folders"].items():
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    input_ids = torch.tensor(args["input_ids"])
    attention_mask = (input_ids != 0).long()
    constrained = model.generate(
        input_ids, attention_mask=attention_mask, custom_generate=folder, trust_remote_code=True,
        constraints=args["constraints"], num_beams=4, max_new_tokens=12, num_return_sequences=2,
    )
    # generate's own route for custom_generate=<folder> (load_custom_generate), by-passing the replacement
    by_loading = type(model).generate(
        model, input_ids, attention_mask=attention_mask, custom_generate=folder, trust_remote_code=True,
        constraints=args["constraints"], num_beams=4, max_new_tokens=12, num_return_sequences=2,
    )
    plain = model.generate(input_ids, attention_mask=attention_mask, num_beams=4, max_new_tokens=12)
    replaced = model.generate.func if isinstance(model.generate, functools.partial) else model.generate
    results[name] = {
        "constrained": constrained.tolist(), "by_loading": by_loading.tolist(), "plain": plain.tolist(),
        "model_module": type(model).__module__, "generate_module": replaced.__module__,
    }
print(json.dumps(results))
"""


def test_an_exported_folder_decodes_with_constraints_where_the_package_is_absent(trained, tmp_path):
    """register_for_auto_class + save_pretrained + write_custom_generate: a fresh process that cannot
    import attention_seq2seq loads the folder with trust_remote_code=True and decodes with
    custom_generate=<folder> as in this process; its plain generate is unchanged."""
    folders = {}
    for family, model in trained.items():
        folder = tmp_path / family
        cls = type(model)
        cls.register_for_auto_class("AutoModelForSeq2SeqLM")
        try:
            model.save_pretrained(folder)
        finally:
            del cls._auto_class  # the class is shared with the other tests
        written = write_custom_generate(folder)
        assert [p.relative_to(folder).as_posix() for p in written] == [
            "custom_generate/generate.py",
            "custom_generate/requirements.txt",
        ]
        folders[family] = str(folder)
    input_ids, attention_mask = _sources([5, 6, 7, 8], [11, 12, 13])
    constraints = [[[20], [21, 22]], []]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules_cache"), "PYTHONPATH": ""}
    payload = json.dumps({"folders": folders, "input_ids": input_ids.tolist(), "constraints": constraints})
    completed = subprocess.run(
        [sys.executable, "-c", _CUSTOM_GENERATE_CHILD, payload],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    child = json.loads(completed.stdout.strip().splitlines()[-1])
    for family, model in trained.items():
        result = child[family]
        assert result["model_module"].startswith("transformers_modules")
        assert result["generate_module"].startswith("transformers_modules")  # from_pretrained put ours in
        expected = constrained_beam_search(model, input_ids, attention_mask, constraints, 4, 12, num_return_sequences=2)
        assert result["constrained"] == result["by_loading"] == expected.tolist()
        plain = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=4, max_new_tokens=12)
        assert result["plain"] == plain.tolist()
