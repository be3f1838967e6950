"""The seam between the reference models and their CPU fast paths (modeling/cpu_fast_paths.py):
`use_cpu_fast_paths=False` reaches none of them, and gives the same numbers as the default."""

from __future__ import annotations

import pytest
import torch

from attention_seq2seq.modeling import cpu_fast_paths
from helpers import padded_batch, rnn_model, tiny_model


# Every method of the seam's class: a new fast path is covered by these tests without a change here.
FAST_PATHS = tuple(name for name in vars(cpu_fast_paths.CPUFastPaths) if not name.startswith("_"))


def _refuse(*args, **kwargs):
    raise AssertionError("a CPU fast path ran with use_cpu_fast_paths=False")


def refuse_fast_paths(monkeypatch) -> None:
    """Make every method of the fast paths raise, so that a test fails if one is reached."""
    for name in FAST_PATHS:
        monkeypatch.setattr(cpu_fast_paths.CPUFastPaths, name, staticmethod(_refuse))


def count_fast_paths(monkeypatch) -> dict[str, int]:
    """Count the calls of every fast path (they still run)."""
    calls = dict.fromkeys(FAST_PATHS, 0)
    for name in FAST_PATHS:
        method = getattr(cpu_fast_paths.CPUFastPaths, name)

        def counted(*args, _name=name, _method=method, **kwargs):
            calls[_name] += 1
            return _method(*args, **kwargs)

        monkeypatch.setattr(cpu_fast_paths.CPUFastPaths, name, staticmethod(counted))
    return calls


def _pair(build, **overrides):
    """The same weights twice: fast paths on (the default) and off."""
    on = build(**overrides)
    off = build(**overrides)
    off.load_state_dict(on.state_dict())
    off.config.use_cpu_fast_paths = False
    return on, off


def _loss_and_grads(model, autocast: bool = False, **batch):
    model.train()
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_the_seam_is_the_config_field():
    on, off = _pair(tiny_model, preset="small")
    assert on.config.use_cpu_fast_paths is True
    assert cpu_fast_paths.fast_paths(on.config) is cpu_fast_paths.CPU_FAST_PATHS
    assert cpu_fast_paths.fast_paths(off.config) is None

    class SavedBeforeTheField:  # a config.json written before the field existed
        pass

    assert cpu_fast_paths.fast_paths(SavedBeforeTheField()) is cpu_fast_paths.CPU_FAST_PATHS


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_transformer_logits_loss_gradients_and_generate_are_the_same_without_fast_paths(
    attn_implementation, monkeypatch
):
    torch.manual_seed(0)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    labels = decoder_input_ids.roll(-1, 1)
    labels[1, 4:] = -100
    on, off = _pair(tiny_model, preset="small", attn_implementation=attn_implementation, label_smoothing=0.1)
    calls = count_fast_paths(monkeypatch)
    on_out = {}
    with torch.no_grad():
        on_out["logits"] = on.eval()(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids
        ).logits
        on_out["greedy"] = on.generate(input_ids, attention_mask=attention_mask, num_beams=1, max_new_tokens=8)
        on_out["beam"] = on.generate(input_ids, attention_mask=attention_mask, num_beams=3, max_new_tokens=8)
    on_out["loss"], on_out["grads"] = _loss_and_grads(
        on, input_ids=input_ids, attention_mask=attention_mask, labels=labels
    )
    assert all(calls.values()), calls  # the default reached every fast path
    refuse_fast_paths(monkeypatch)
    with torch.no_grad():
        logits = off.eval()(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids
        ).logits
        greedy = off.generate(input_ids, attention_mask=attention_mask, num_beams=1, max_new_tokens=8)
        beam = off.generate(input_ids, attention_mask=attention_mask, num_beams=3, max_new_tokens=8)
    loss, grads = _loss_and_grads(off, input_ids=input_ids, attention_mask=attention_mask, labels=labels)

    real = attention_mask.bool()
    assert real.all(dim=1).tolist() == [True, False]  # the padding-free encoder had work to skip
    torch.testing.assert_close(logits, on_out["logits"], rtol=1e-5, atol=1e-5)
    assert greedy.tolist() == on_out["greedy"].tolist()
    assert beam.tolist() == on_out["beam"].tolist()
    torch.testing.assert_close(loss, on_out["loss"], rtol=1e-6, atol=1e-6)
    assert grads.keys() == on_out["grads"].keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, on_out["grads"][name], rtol=1e-5, atol=1e-6, msg=name)


def test_transformer_bf16_training_is_the_same_without_fast_paths_up_to_bf16_rounding(monkeypatch):
    """Under CPU bf16 autocast the fast paths train the attention in float32; the reference keeps
    it in bf16: the same loss and gradients up to bf16 rounding."""
    torch.manual_seed(0)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    labels = decoder_input_ids.roll(-1, 1)
    on, off = _pair(tiny_model, preset="small")
    batch = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    on_loss, on_grads = _loss_and_grads(on, autocast=True, **batch)
    refuse_fast_paths(monkeypatch)
    off_loss, off_grads = _loss_and_grads(off, autocast=True, **batch)
    assert abs(off_loss.item() - on_loss.item()) < 0.02 * on_loss.item()
    flat = lambda grads: torch.cat([g.flatten().float() for g in grads.values()])  # noqa: E731
    assert torch.nn.functional.cosine_similarity(flat(off_grads), flat(on_grads), dim=0) > 0.99


@pytest.mark.parametrize("variant", ["bahdanau-lstm-coverage", "luong-general-feed-gru"])
def test_rnn_loss_and_gradients_are_the_same_without_fast_paths(variant, monkeypatch):
    input_ids = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
    attention_mask = (input_ids != 0).long()
    labels = torch.tensor([[11, 12, 13, 2], [14, 2, -100, -100]])
    on, off = _pair(rnn_model, variant=variant, label_smoothing=0.1, dropout=0.0)
    batch = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    on_loss, on_grads = _loss_and_grads(on, **batch)
    refuse_fast_paths(monkeypatch)
    off_loss, off_grads = _loss_and_grads(off, **batch)
    torch.testing.assert_close(off_loss, on_loss, rtol=1e-6, atol=1e-6)
    assert off_grads.keys() == on_grads.keys()
    for name, grad in off_grads.items():
        torch.testing.assert_close(grad, on_grads[name], rtol=1e-5, atol=1e-6, msg=name)
