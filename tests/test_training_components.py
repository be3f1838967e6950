"""Unit tests of the training helpers: schedules, metrics, checkpoint averaging, heat-maps."""

from __future__ import annotations


import json

import numpy as np
import pytest
import sacrebleu
import torch
from safetensors.torch import save_file

from attention_seq2seq.training.averaging import average_checkpoints, average_state_dicts, load_averaged_weights
from attention_seq2seq.translation.scores import corpus_scores
from attention_seq2seq.attention.plotting import plot_cross_attentions
from attention_seq2seq.training.schedules import LearningRateSchedule, PlateauDecay, TimeBudget, build_scheduler


# ----------------------------------------------------------------------------------- schedules
def _lrs(name, steps, peak=1.0, **kwargs):
    """Learning rate in effect for each of ``steps`` optimizer updates."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    sched = build_scheduler(opt, name, **kwargs)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def test_inverse_sqrt_matches_vaswani_formula():
    # The paper's lrate = d_model^-0.5 * min(n^-0.5, n * warmup^-1.5), n = 1-based update number,
    # equals our curve with peak lr = d_model^-0.5 * warmup^-0.5.
    d_model, warmup = 512, 40
    peak = d_model**-0.5 * warmup**-0.5
    got = _lrs("inverse_sqrt", 200, peak=peak, warmup_steps=warmup)
    for n, lr in enumerate(got, start=1):
        expected = d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)
        assert lr == pytest.approx(expected, rel=1e-12), n
    assert max(got) == pytest.approx(peak) and got.index(max(got)) == warmup - 1


def test_linear_schedule_hand_computed():
    got = _lrs("linear", 12, peak=2.0, warmup_steps=2, total_steps=10)
    # warm-up 1/2, 2/2 of the peak; then (10 - step) / 8 of the peak; zero from step 10 on.
    assert got == pytest.approx([1.0, 2.0, 2.0, 1.75, 1.5, 1.25, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0])


def _linear_time_lrs(steps, seconds_per_update, budget_s, warmup_steps, total_steps=None):
    """Learning rates of a ``linear_time`` run on a simulated clock, observed after every update
    in the order of the training loop (update, scheduler step, then the clock)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    budget = TimeBudget(budget_s)
    sched = build_scheduler(opt, "linear_time", warmup_steps=warmup_steps, total_steps=total_steps, time_budget=budget)
    lrs = []
    for i in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        budget.observe(seconds_per_update * (i + 1), step=i + 1, warmup_steps=warmup_steps)
    return lrs, budget


def test_linear_time_schedule_reaches_zero_at_the_end_of_the_budget():
    # 10 s per update, 100 s budget, 2 warm-up updates: the decay starts at 20 s and falls by
    # 10/80 per update; each rate uses the clock read one update earlier.
    lrs, budget = _linear_time_lrs(13, 10.0, 100.0, warmup_steps=2)
    assert lrs == pytest.approx([0.5, 1.0, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0, 0.0])
    # A faster host fits more updates into the same budget and still ends at 0.
    fast, _ = _linear_time_lrs(25, 5.0, 100.0, warmup_steps=2)
    assert (
        fast[4] == pytest.approx(1 - 5 / 90)
        and fast[20] == pytest.approx(5 / 90)
        and fast[21:] == pytest.approx([0.0] * 4)
    )
    assert all(a >= b for a, b in zip(fast[2:], fast[3:]))
    # With max_steps too, the rate is the lower of the two lines (whichever limit comes first).
    both, _ = _linear_time_lrs(13, 10.0, 100.0, warmup_steps=2, total_steps=8)
    assert both[4:9] == pytest.approx(
        [min((8 - s) / 6, t) for s, t in zip(range(4, 9), [0.875, 0.75, 0.625, 0.5, 0.375])]
    )
    restored = TimeBudget(100.0)
    restored.load_state_dict(budget.state_dict())
    assert (restored.decay_start_s, restored.elapsed_s, restored.remaining_fraction()) == (20.0, 130.0, 0.0)
    # Resumed with a longer budget: the line now ends at the new budget (and the run stops there).
    longer = TimeBudget(180.0)
    longer.load_state_dict({**budget.state_dict(), "elapsed_s": 100.0})
    assert longer.remaining_fraction() == pytest.approx((180 - 100) / (180 - 20))


def test_linear_time_needs_a_clock():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="max_time_minutes"):
        build_scheduler(opt, "linear_time", warmup_steps=0)
    with pytest.raises(ValueError, match="max_time_minutes > 0"):
        TimeBudget(0.0)


def test_constant_schedule_and_no_warmup():
    assert _lrs("constant", 4, peak=3.0, warmup_steps=3) == pytest.approx([1.0, 2.0, 3.0, 3.0])
    assert _lrs("constant", 2, peak=3.0, warmup_steps=0) == pytest.approx([3.0, 3.0])


def test_plateau_decays_after_patience_and_checkpoints_its_state():
    decay = PlateauDecay(factor=0.5, patience=2, higher_is_better=True)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(opt, "plateau", warmup_steps=0, plateau=decay)
    history = []
    for bleu in [10.0, 12.0, 11.0, 11.5, 13.0, 12.0, 12.0]:  # decays after the 4th and 7th value
        history.append(decay.observe(bleu))
        opt.step()
        sched.step()
        history.append(opt.param_groups[0]["lr"])
    assert history[1::2] == [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25]
    assert history[0::2] == [False, False, False, True, False, False, True]
    restored = PlateauDecay(factor=0.5, patience=2)
    restored.load_state_dict(decay.state_dict())
    assert restored.multiplier == 0.25 and restored.best == 13.0


def test_plateau_lower_is_better_for_loss():
    decay = PlateauDecay(factor=0.1, patience=1, higher_is_better=False)
    assert [decay.observe(v) for v in [3.0, 2.0, 2.5]] == [False, False, True]
    assert decay.multiplier == pytest.approx(0.1)


def test_unknown_schedule_names_the_valid_ones():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="inverse_sqrt.*linear.*got 'cosine'"):
        build_scheduler(opt, "cosine", warmup_steps=0)
    with pytest.raises(ValueError, match="max_steps"):
        build_scheduler(opt, "linear", warmup_steps=0, total_steps=None)


def _schedule(name, peak=1.0, **kwargs):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    return opt, LearningRateSchedule(opt, name, **kwargs)


def test_the_schedule_object_reads_only_the_events_its_kind_uses():
    # plateau: validations decay the rate; the clock is ignored
    opt, plateau = _schedule("plateau", warmup_steps=0, plateau_factor=0.5, plateau_patience=1)
    for score in (10.0, 9.0):  # the second does not improve: halve
        plateau.observe_validation(score)
        plateau.observe_time(1e9, 100)
        opt.step()
        plateau.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5) and plateau.time_budget is None and not plateau.reads_clock
    # linear_time: the clock anneals the rate; validations are ignored
    opt, timed = _schedule("linear_time", warmup_steps=1, time_budget_s=100.0)
    assert timed.reads_clock
    timed.observe_validation(1.0)
    timed.observe_validation(0.0)
    assert timed.plateau.multiplier == 1.0
    timed.observe_time(0.0, 1)  # decay starts after the warm-up update
    timed.observe_time(75.0, 1)
    opt.step()
    timed.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.25)
    # others: neither
    opt, constant = _schedule("constant", warmup_steps=0)
    constant.observe_validation(1.0)
    constant.observe_validation(0.0)
    constant.observe_time(1e9, 5)
    opt.step()
    constant.step()
    assert opt.param_groups[0]["lr"] == 1.0


def test_the_schedule_object_checkpoints_its_whole_state():
    opt, timed = _schedule("linear_time", warmup_steps=0, time_budget_s=100.0)
    timed.observe_time(40.0, 3)
    for _ in range(3):
        opt.step()
        timed.step()
    saved = timed.state_dict()
    assert set(saved) == {"lr_scheduler", "plateau", "time_budget"}
    _, restored = _schedule("linear_time", warmup_steps=0, time_budget_s=100.0)
    assert restored.load_state_dict(saved) is True
    assert restored.state_dict() == saved
    # a run switched to linear_time on resume: no clock in the checkpoint, the decay starts anew
    _, switched = _schedule("linear_time", warmup_steps=0, time_budget_s=100.0)
    assert switched.load_state_dict({k: v for k, v in saved.items() if k != "time_budget"}) is False
    assert switched.time_budget.decay_start_s is None
    # and a checkpoint with a clock resumed under another schedule ignores it
    _, plain = _schedule("inverse_sqrt", warmup_steps=4)
    assert plain.load_state_dict(saved) is True and "time_budget" not in plain.state_dict()


# ------------------------------------------------------------------------------------- metrics
HYPS = ["The cat sat on the mat .", "A dog runs in the park", "Two men are playing football."]
REFS = ["The cat sat on the mat.", "A dog is running in a park.", "Two men play soccer."]


def test_scores_equal_sacrebleu_called_directly():
    scores = corpus_scores(HYPS, REFS, target_lang="en")
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score, abs=1e-9)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score, abs=1e-9)
    assert 0.0 < scores["bleu"] < 100.0
    assert "tok:13a" in scores["bleu_signature"] and f"version:{sacrebleu.__version__}" in scores["bleu_signature"]
    assert "nc:6" in scores["chrf_signature"]


def test_identical_output_scores_100_and_chinese_uses_zh_tokenizer():
    assert corpus_scores(REFS, REFS)["bleu"] == pytest.approx(100.0)
    zh_h, zh_r = ["我喜欢猫。"], ["我喜欢狗。"]
    scores = corpus_scores(zh_h, zh_r, target_lang="zh")
    assert "tok:zh" in scores["bleu_signature"]
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(zh_h, [zh_r], tokenize="zh").score)


def test_bootstrap_interval_halves_with_four_times_the_test_sentences(monkeypatch):
    monkeypatch.delenv("SACREBLEU_SEED", raising=False)
    small = corpus_scores(HYPS * 10, REFS * 10, n_bootstrap=1000)
    large = corpus_scores(HYPS * 40, REFS * 40, n_bootstrap=1000)
    # The spread of a resampled corpus score falls as 1/sqrt(sentences): 4x the sentences, half the interval.
    for key in ("bleu_ci95", "bleu_lowercase_ci95", "chrf_ci95"):
        assert small[key] > 1.0 and 0.42 < large[key] / small[key] < 0.6, key
    # The score itself stays the whole test set's; the interval is seeded, so a rerun repeats it.
    assert small["bleu"] == corpus_scores(HYPS * 10, REFS * 10)["bleu"]
    assert corpus_scores(HYPS * 10, REFS * 10, n_bootstrap=1000)["bleu_ci95"] == small["bleu_ci95"]
    assert "|bs:1000|seed:12345|" in small["bleu_signature"] and "|bs:1000|seed:12345|" in small["chrf_signature"]
    assert "bleu_ci95" not in corpus_scores(HYPS, REFS)
    # A perfect output scores 100 on every resample: no interval.
    assert corpus_scores(REFS, REFS, n_bootstrap=100)["bleu_ci95"] == 0.0
    with pytest.raises(ValueError, match="n_bootstrap must be 1"):
        corpus_scores(HYPS, REFS, n_bootstrap=0)


def test_bootstrap_interval_of_a_system_that_matches_almost_nothing():
    # One sentence of ten shares anything with its reference, so about a third of the resamples
    # have no matching n-gram or character at all. sacreBLEU scores those Python 0.0 and the rest
    # numpy float32, and its interval estimate used to raise TypeError on the mix.
    hyps = ["a man rides a horse on the beach ."] + ["999 888"] * 9
    refs = ["a man rides a horse on the beach ."] + ["two dogs play in the snow ."] * 9
    scores = corpus_scores(hyps, refs, n_bootstrap=200)
    for key in ("bleu", "bleu_lowercase", "chrf"):
        assert scores[key] == corpus_scores(hyps, refs)[key] and scores[f"{key}_ci95"] > 0, key


def test_scores_refuse_a_bare_string_as_references_or_hypotheses():
    """A string is a sequence of one-character "sentences": corpus_scores(["abc", "a", "b"], "abc")
    scored them (chrF 29.4; with three one-letter hypotheses, 100) instead of refusing."""
    with pytest.raises(ValueError, match="references must be a list of strings.*single string"):
        corpus_scores(["a", "b", "c"], "abc")
    with pytest.raises(ValueError, match="hypotheses must be a list of strings.*single string"):
        corpus_scores("abc", ["a", "b", "c"])
    with pytest.raises(ValueError, match=r"references\[0\] must be a string"):
        corpus_scores(["abc"], [["abc"]])  # sacreBLEU's multi-reference layout is not this function's


def test_scores_reject_mismatched_lengths():
    with pytest.raises(ValueError, match="2 hypotheses for 3 references"):
        corpus_scores(HYPS[:2], REFS)


# ----------------------------------------------------------------------------------- averaging
def _write(folder, state):
    folder.mkdir(parents=True)
    save_file(state, str(folder / "model.safetensors"))
    return folder


def test_average_of_identical_checkpoints_is_the_same_weights(tmp_path):
    state = {"w": torch.randn(4, 3), "b": torch.randn(3), "count": torch.tensor([7])}
    a = _write(tmp_path / "a", state)
    b = _write(tmp_path / "b", state)
    avg = average_checkpoints([a, b])
    for k in state:
        assert torch.equal(avg[k], state[k]), k


def test_average_of_two_checkpoints_is_their_mean(tmp_path):
    s1 = {"w": torch.randn(4, 3), "h": torch.randn(5, dtype=torch.float64)}
    s2 = {"w": torch.randn(4, 3), "h": torch.randn(5, dtype=torch.float64)}
    avg = average_checkpoints([_write(tmp_path / "1", s1), _write(tmp_path / "2", s2)])
    torch.testing.assert_close(avg["w"], (s1["w"] + s2["w"]) / 2)
    torch.testing.assert_close(avg["h"], (s1["h"] + s2["h"]) / 2, rtol=0, atol=1e-15)
    assert avg["h"].dtype == torch.float64


def test_average_rejects_different_parameters():
    with pytest.raises(ValueError, match="different parameters"):
        average_state_dicts([{"a": torch.zeros(1)}, {"b": torch.zeros(1)}])
    with pytest.raises(ValueError, match="different shapes"):
        average_state_dicts([{"a": torch.zeros(1)}, {"a": torch.zeros(2)}])


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.tie_weights()

    def tie_weights(self):
        self.head.weight = self.embed.weight


def test_loading_averaged_weights_keeps_tying_and_rejects_missing():
    model = _Tied()
    new = torch.randn(5, 3)
    load_averaged_weights(model, {"embed.weight": new})  # head.weight tied, so not stored
    assert torch.equal(model.head.weight, new) and model.head.weight is model.embed.weight
    untied = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="lack parameters"):
        load_averaged_weights(untied, {"0.weight": torch.zeros(2, 2), "0.bias": torch.zeros(2)})


# ------------------------------------------------------------------------------------ plotting
def test_rnn_alignment_writes_one_figure(tmp_path):
    weights = np.random.default_rng(0).dirichlet(np.ones(4), size=3)[None]  # (1 head, 3 tgt, 4 src)
    files = plot_cross_attentions([weights], ["a", "b", "c", "</s>"], ["x", "y", "</s>"], tmp_path, "attention_val_0")
    assert files == [tmp_path / "attention_val_0.png"]
    assert files[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_transformer_attention_writes_average_and_per_head_figures(tmp_path):
    rng = np.random.default_rng(0)
    layers = [rng.dirichlet(np.ones(5), size=(4, 2)) for _ in range(3)]  # 3 layers of (4 heads, 2, 5)
    files = plot_cross_attentions(layers, list("abcde"), ["p", "q"], tmp_path, "attn")
    assert [f.name for f in files] == [
        "attn.png",
        "attn_layer1_heads.png",
        "attn_layer2_heads.png",
        "attn_layer3_heads.png",
    ]
    assert all(f.stat().st_size > 1000 for f in files)


def test_plot_rejects_weights_that_do_not_match_tokens(tmp_path):
    with pytest.raises(ValueError, match="3 target x 2 source"):
        plot_cross_attentions([np.ones((1, 3, 4))], ["a", "b"], ["x", "y", "z"], tmp_path, "bad")


def test_lowercased_bleu_ignores_case_and_cased_bleu_does_not():
    hyps, refs = ["THE CAT SAT ON THE MAT ."], ["the cat sat on the mat ."]
    scores = corpus_scores(hyps, refs, target_lang="en")
    assert scores["bleu_lowercase"] == pytest.approx(100.0)
    assert scores["bleu"] < 10.0  # only "." matches when case counts
    assert "case:lc" in scores["bleu_lowercase_signature"] and "case:mixed" in scores["bleu_signature"]


def test_average_checkpoints_reads_sharded_save_pretrained_folders(tmp_path, capsys):
    # A model saved with max_shard_size (model.safetensors.index.json + shards) averages to the
    # same weights as the same two models saved whole, through the command as a user runs it.
    from transformers import AutoModelForSeq2SeqLM

    from attention_seq2seq import TransformerSeq2SeqConfig
    from attention_seq2seq.cli import main

    config = TransformerSeq2SeqConfig(
        vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=16,
    )  # fmt: skip
    folders = {}
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = AutoModelForSeq2SeqLM.from_config(config)
        model.save_pretrained(tmp_path / f"sharded{seed}", max_shard_size="8KB")
        model.save_pretrained(tmp_path / f"whole{seed}")
        folders[seed] = model
    assert (tmp_path / "sharded0" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "sharded0").glob("model-*.safetensors"))) > 1
    for kind in ("sharded", "whole"):
        argv = ["average-checkpoints", str(tmp_path / f"{kind}0"), str(tmp_path / f"{kind}1")]
        assert main([*argv, "--config-from", str(tmp_path / "whole0"), "-o", str(tmp_path / f"avg_{kind}")]) == 0
    capsys.readouterr()
    sharded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg_sharded").state_dict()
    whole = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg_whole").state_dict()
    expected = {k: (v + folders[1].state_dict()[k]) / 2 for k, v in folders[0].state_dict().items()}
    for name, value in sharded.items():
        assert torch.equal(value, whole[name]), name
        torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-7)


def test_average_checkpoints_names_a_missing_shard(tmp_path):
    from attention_seq2seq.training.averaging import load_checkpoint_weights

    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_file({"a": torch.zeros(2)}, str(folder / "model-00001-of-00002.safetensors"))
    index = {
        "metadata": {},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        load_checkpoint_weights(folder)
    (folder / "model.safetensors.index.json").write_text("{")
    with pytest.raises(ValueError, match="weight_map"):
        load_checkpoint_weights(folder)
