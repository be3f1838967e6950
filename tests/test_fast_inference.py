"""Inference fast paths (modeling/cpu_fast_paths.py and their use in the Transformer): each one
must give the plain computation's numbers and follow every change of the weights it caches."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attention_seq2seq.modeling import cpu_fast_paths, modeling_transformer_seq2seq
from attention_seq2seq.modeling.cpu_fast_paths import PaddingFreeLayout, packed_linear
from test_transformer_seq2seq import padded_batch, tiny_model


class _Run:  # stands for the decoding cache of one generate() call
    pass


@pytest.fixture
def packing_on(monkeypatch):
    """Pack whatever this machine measured (`packing_pays_off`): the packed path itself is under test."""
    monkeypatch.setattr(cpu_fast_paths, "packing_pays_off", lambda weight, bias=None: True)


@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_f_linear_within_a_run_and_repacks_for_the_next(bias, packing_on):
    torch.manual_seed(0)
    layer = nn.Linear(16, 50, bias=bias)
    x = torch.randn(3, 5, 16)
    run = _Run()
    with torch.no_grad():
        torch.testing.assert_close(
            packed_linear(x, layer, run), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5
        )
        if torch.backends.mkldnn.is_available():
            assert cpu_fast_paths._PACKED[layer].packed is not None  # the packed copy is kept for the run
        for rows in (1, 7, 200):  # other row counts than the first call's
            y = torch.randn(rows, 16)
            torch.testing.assert_close(
                packed_linear(y, layer, run), F.linear(y, layer.weight, layer.bias), rtol=1e-5, atol=1e-5
            )
        assert packed_linear(x[:0], layer, run).shape == (0, 5, 50)
        # Between runs the weights change in every way a user can change them; a new run sees it.
        layer.weight.mul_(-2.0)
        torch.testing.assert_close(
            packed_linear(x, layer, _Run()), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5
        )
        layer.weight.data.copy_(torch.randn(50, 16))  # bypasses the version counter
        torch.testing.assert_close(
            packed_linear(x, layer, _Run()), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5
        )
        layer.load_state_dict({k: torch.randn_like(v) for k, v in layer.state_dict().items()})
        torch.testing.assert_close(
            packed_linear(x, layer, _Run()), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5
        )
        # Without a run (a loss evaluation, no cache): the plain layer.
        assert torch.equal(packed_linear(x, layer, None), layer(x))


def test_packed_linear_under_autograd_or_half_precision_is_the_plain_layer():
    torch.manual_seed(0)
    layer = nn.Linear(8, 20)
    x = torch.randn(4, 8)
    out = packed_linear(x, layer, _Run())
    assert out.requires_grad
    out.sum().backward()
    torch.testing.assert_close(layer.weight.grad, x.sum(0).expand(20, 8))
    with torch.no_grad():
        half = layer.to(torch.bfloat16)
        xb = x.to(torch.bfloat16)
        assert torch.equal(packed_linear(xb, half, _Run()), half(xb))


def test_evaluation_between_training_steps_sees_the_updated_weights():
    torch.manual_seed(0)
    model = tiny_model()
    input_ids, attention_mask, _ = padded_batch()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        with torch.no_grad():
            fast = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=6,
                output_scores=True,
                return_dict_in_generate=True,
            )
            plain = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=6,
                output_scores=True,
                return_dict_in_generate=True,
                use_cache=False,
            )
        for a, b in zip(fast.scores, plain.scores):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        model.train()
        model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids[:, :5].clamp(min=4)).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        model.eval()


def test_models_built_under_inference_mode_copy_and_pickle_after_generating(packing_on):
    input_ids, attention_mask, _ = padded_batch()
    with torch.inference_mode():  # parameters are inference tensors: no version counter to read
        model = tiny_model()
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=2, max_new_tokens=4)
    assert out.shape[0] == 2
    model = tiny_model()
    with torch.no_grad():
        model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=4)
    if torch.backends.mkldnn.is_available():
        assert cpu_fast_paths._PACKED[model.lm_head].packed is not None  # generate() took the packed path
    twin = copy.deepcopy(model)  # the packed (storage-less) copy lives outside the module
    pickle.loads(pickle.dumps(model))
    for a, b in zip(model.state_dict().values(), twin.state_dict().values()):
        assert torch.equal(a, b)


def test_padding_free_layout_round_trip_puts_zeros_at_padding():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    states = torch.randn(3, 4, 5)
    layout = PaddingFreeLayout(mask)
    tokens = layout.unpad(states)
    assert tokens.shape == (int(mask.sum()), 5)
    torch.testing.assert_close(tokens, states[mask.bool()])
    padded = layout.pad(tokens)
    torch.testing.assert_close(padded, states * mask[..., None])
    assert PaddingFreeLayout.worth_it(mask)
    assert not PaddingFreeLayout.worth_it(torch.ones(2, 3, dtype=torch.long))
    assert not PaddingFreeLayout.worth_it(None)


@pytest.mark.parametrize("norm_order", ["post", "pre"])
def test_padding_free_encoder_equals_the_padded_encoder_on_real_tokens(norm_order):
    torch.manual_seed(0)
    model = tiny_model(norm_order=norm_order)
    input_ids, attention_mask, _ = padded_batch()
    encoder = model.get_encoder()
    with torch.no_grad():
        free = encoder(input_ids, attention_mask).last_hidden_state
        # asking for hidden states keeps the padded layout (every layer's full output is returned)
        padded = encoder(input_ids, attention_mask, output_hidden_states=True).last_hidden_state
    real = attention_mask.bool()
    torch.testing.assert_close(free[real], padded[real], rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(free[~real]) == 0
    assert torch.count_nonzero(padded[~real]) > 0  # the padded path did compute those positions


def spy_on_matmul_attention(monkeypatch) -> list[int]:
    """Record the number of queries of every attention that runs as plain matmuls (not SDPA)."""
    calls = []
    plain = modeling_transformer_seq2seq.eager_attention_forward

    def spy(module, query, *args, **kwargs):
        calls.append(query.size(2))
        return plain(module, query, *args, **kwargs)

    monkeypatch.setattr(modeling_transformer_seq2seq, "eager_attention_forward", spy)
    return calls


@pytest.mark.parametrize("num_beams", [1, 3])
def test_decoding_steps_without_sdpa_give_the_sdpa_results(monkeypatch, num_beams):
    torch.manual_seed(0)
    model = tiny_model()
    input_ids, attention_mask, _ = padded_batch()
    kwargs = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        num_beams=num_beams,
        max_new_tokens=10,
        output_scores=True,
        return_dict_in_generate=True,
    )
    calls = spy_on_matmul_attention(monkeypatch)
    fast = model.generate(**kwargs)
    assert calls and max(calls) <= num_beams  # decoding steps bypassed SDPA; the encoder did not
    monkeypatch.setattr(cpu_fast_paths, "_DECODE_STEP_MAX_QUERIES", 0)  # SDPA at every step
    calls.clear()
    reference = model.generate(**kwargs)
    assert not calls
    assert fast.sequences.tolist() == reference.sequences.tolist()
    for a, b in zip(fast.scores, reference.scores):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("autocast", [False, True])
def test_short_training_steps_without_sdpa_give_the_sdpa_loss_and_gradients(monkeypatch, autocast):
    torch.manual_seed(0)
    model = tiny_model(dropout=0.0).train()  # no dropout: both paths see the same numbers
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    labels = decoder_input_ids.roll(-1, dims=1)
    calls = spy_on_matmul_attention(monkeypatch)

    def loss_and_grads():
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(
                input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, labels=labels
            )
        out.loss.backward()
        return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    fast_loss, fast_grads = loss_and_grads()
    layers = model.config.encoder_layers + 2 * model.config.decoder_layers
    assert len(calls) == layers  # every attention of the step bypassed SDPA
    monkeypatch.setattr(cpu_fast_paths, "_TRAIN_STEP_MAX_KEYS", 0)  # SDPA everywhere
    calls.clear()
    sdpa_loss, sdpa_grads = loss_and_grads()
    assert not calls
    tol = dict(rtol=2e-2, atol=2e-3) if autocast else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fast_loss, sdpa_loss, **tol)
    assert fast_grads.keys() == sdpa_grads.keys()
    for name in fast_grads:
        torch.testing.assert_close(fast_grads[name], sdpa_grads[name], **tol, msg=name)
    # longer sentences keep SDPA
    monkeypatch.setattr(cpu_fast_paths, "_TRAIN_STEP_MAX_KEYS", input_ids.size(1) - 1)
    calls.clear()
    loss_and_grads()
    assert len(calls) == model.config.decoder_layers  # only the decoder self-attention (6 keys) bypassed it


def test_fused_projection_keeps_the_weight_for_a_run_and_follows_changes_between_runs():
    torch.manual_seed(0)
    projections = tuple(nn.Linear(8, 8) for _ in range(3))
    x = torch.randn(4, 1, 8)

    def reference():
        return modeling_transformer_seq2seq.fused_linear(x, *projections)

    run = _Run()
    with torch.no_grad():
        torch.testing.assert_close(cpu_fast_paths.fused_projection(x, projections, run), reference())
        kept = cpu_fast_paths._FUSED[projections[0]].weight
        cpu_fast_paths.fused_projection(x, projections, run)
        assert cpu_fast_paths._FUSED[projections[0]].weight is kept  # built once per run
        projections[1].weight.mul_(-2.0)  # between runs, in place
        torch.testing.assert_close(cpu_fast_paths.fused_projection(x, projections, _Run()), reference())
        projections[2].weight.data.copy_(torch.randn(8, 8))  # bypasses the version counter
        projections[0].bias.data.copy_(torch.randn(8))
        torch.testing.assert_close(cpu_fast_paths.fused_projection(x, projections, _Run()), reference())
    out = cpu_fast_paths.fused_projection(x, projections, _Run())  # under autograd: the reference's graph
    out.sum().backward()
    assert projections[1].weight.grad is not None


@pytest.mark.parametrize(
    "timing, packs",
    [
        ({"pack_s": 1.14e-3, "plain_step_s": 2.02e-3, "packed_step_s": 1.84e-3}, False),  # timed on the Intel Xeon
        ({"pack_s": 0.5e-3, "plain_step_s": 2.68e-3, "packed_step_s": 1.24e-3}, True),  # the AMD EPYC's
    ],
)
def test_packing_follows_the_measurement_of_this_machine_and_keeps_it(timing, packs, monkeypatch, tmp_path):
    """Packing is chosen when packing once costs less than 16 steps save; the timing is stored,
    so a second decision (in another process: the memo is cleared) reads it instead of measuring."""
    monkeypatch.setenv("ATTENTION_SEQ2SEQ_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_fast_paths, "_PACKING_DECISIONS", {})
    calls = []
    monkeypatch.setattr(cpu_fast_paths, "_time_packing", lambda weight, bias: calls.append(1) or dict(timing))
    torch.manual_seed(0)
    layer = nn.Linear(16, 50)
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(packed_linear(x, layer, _Run()), layer(x), rtol=1e-5, atol=1e-5)
        if torch.backends.mkldnn.is_available():
            assert (cpu_fast_paths._PACKED[layer].packed is not None) == packs
        cpu_fast_paths._PACKING_DECISIONS.clear()
        assert cpu_fast_paths.packing_pays_off(layer.weight, layer.bias) == packs
    assert calls == [1]
    assert (tmp_path / "packed_linear.json").is_file()


def test_packing_measurement_times_both_products(monkeypatch, tmp_path):
    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN in this torch build")
    monkeypatch.setenv("ATTENTION_SEQ2SEQ_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_fast_paths, "_PACKING_DECISIONS", {})
    layer = nn.Linear(32, 300)
    state = torch.get_rng_state()
    decision = cpu_fast_paths.packing_pays_off(layer.weight, layer.bias)
    assert torch.equal(torch.get_rng_state(), state)  # a training run's dropout draws are not moved
    (entry,) = json.loads((tmp_path / "packed_linear.json").read_text()).values()
    assert all(entry[k] > 0 for k in ("pack_s", "plain_step_s", "packed_step_s"))
    saved = cpu_fast_paths._PACKING_BREAK_EVEN_STEPS * (entry["plain_step_s"] - entry["packed_step_s"])
    assert decision == (cpu_fast_paths._PACKING_COST_FACTOR * entry["pack_s"] < saved)
