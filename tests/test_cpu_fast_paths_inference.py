"""Inference fast paths (modeling/cpu_fast_paths.py and their use in the Transformer): each one
must give the plain computation's numbers and follow every change of the weights it caches."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

from attention_seq2seq.modeling import cpu_fast_paths, modeling_transformer_seq2seq
from attention_seq2seq.modeling.cpu_fast_paths import PaddingFreeLayout
from helpers import padded_batch, tiny_model


class _Run:  # stands for the decoding cache of one generate() call
    pass


def projections_fused_for_the_run(model) -> bool:
    """Whether a decoder self-attention's Q/K/V weight is held fused (cpu_fast_paths._FUSED)."""
    return model.model.decoder.layers[0].self_attn.q_proj in cpu_fast_paths._FUSED


def test_evaluation_between_training_steps_sees_the_updated_weights():
    torch.manual_seed(0)
    model = tiny_model(preset="small")
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


def test_models_built_under_inference_mode_copy_and_pickle_after_generating():
    input_ids, attention_mask, _ = padded_batch()
    with torch.inference_mode():  # parameters are inference tensors: no version counter to read
        model = tiny_model(preset="small")
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=2, max_new_tokens=4)
    assert out.shape[0] == 2
    model = tiny_model(preset="small")
    with torch.no_grad():
        model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=4)
    assert projections_fused_for_the_run(model)  # generate() kept a fused Q/K/V weight for its run
    twin = copy.deepcopy(model)  # the fused copies live outside the modules
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
    model = tiny_model(preset="small", norm_order=norm_order)
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
    model = tiny_model(preset="small")
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
    model = tiny_model(preset="small", dropout=0.0).train()  # no dropout: both paths see the same numbers
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
        return torch.cat([p(x) for p in projections], dim=-1)

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


class _ScaledLinear(nn.Linear):  # a subclass does its own work: it must be called
    def forward(self, x):
        return 2.0 * super().forward(x)


@pytest.mark.parametrize("how", ["subclass", "hook", "no bias", "quantized"])
def test_fused_projection_stands_aside_for_layers_that_must_be_called(how):
    torch.manual_seed(0)
    projections = [nn.Linear(8, 8) for _ in range(3)]
    if how == "subclass":
        projections[1] = _ScaledLinear(8, 8)
    elif how == "hook":
        projections[2].register_forward_hook(lambda module, args, output: output + 1.0)
    elif how == "no bias":
        projections[0] = nn.Linear(8, 8, bias=False)
    else:
        projections = list(torch.ao.quantization.quantize_dynamic(nn.Sequential(*projections), {nn.Linear}))
    x = torch.randn(4, 2, 8)
    for scope in (None, _Run()):
        with torch.no_grad():
            assert cpu_fast_paths.fused_projection(x, tuple(projections), scope) is None
    config = tiny_model(preset="small").config
    out = modeling_transformer_seq2seq.project(x, tuple(projections), config)
    torch.testing.assert_close(out, torch.cat([p(x) for p in projections], dim=-1))
