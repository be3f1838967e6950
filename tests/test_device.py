"""Both model families on the accelerator: the checks a GPU must pass before its figures count.

Every test here takes the ``device`` fixture: "cuda" where torch sees a GPU, else "cpu" (so CI runs
the same code paths on a CPU, where "the device equals the CPU" compares two CPU copies and the
checks that matter are the autocast, save/load and generate ones). ``scripts/gpu_check.sh`` runs
``pytest -m device`` on a lent GPU; the trainer's resume test in test_training_train.py carries
the marker too (Accelerate puts a run on the GPU by itself there).

Tolerances: float32 on the GPU with TF32 turned off (``device`` fixture), so the GPU's kernels
differ from the CPU's only in summation order: 1e-4 absolute on logits of a tiny model, 1e-3
relative on gradients. Generated token ids must be equal.
"""

from __future__ import annotations

import pytest
import torch
from helpers import padded_batch, rnn_model, source_batch, target_batch, tiny_model

from attention_seq2seq import RNNSeq2SeqForConditionalGeneration, TransformerSeq2SeqForConditionalGeneration

pytestmark = pytest.mark.device

RNN_VARIANTS = ["bahdanau-lstm-coverage", "luong-general-feed-gru", "luong-general-feed-local-p-lstm"]
TRANSFORMER_VARIANTS = [dict(norm_order="post"), dict(norm_order="pre")]


@pytest.fixture
def device():
    """'cuda' when torch sees a GPU (float32 matmuls and cuDNN without TF32 for the duration), else 'cpu'."""
    if not torch.cuda.is_available():
        yield "cpu"
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield "cuda"
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _family_cases():
    """(id, builder, batch) for each model checked: a few RNN decoders and both Transformer norm orders."""
    cases = []
    for variant in RNN_VARIANTS:

        def build(variant=variant):
            return rnn_model(variant)

        def batch():
            input_ids, attention_mask = source_batch()
            decoder_input_ids, decoder_mask = target_batch()
            labels = torch.cat([decoder_input_ids[:, 1:], torch.full_like(decoder_input_ids[:, :1], 0)], 1)
            labels = labels.masked_fill(torch.cat([decoder_mask[:, 1:], decoder_mask[:, :1] * 0], 1) == 0, -100)
            return dict(
                input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, labels=labels
            )

        cases.append(pytest.param(build, batch, id=f"rnn-{variant}"))
    for overrides in TRANSFORMER_VARIANTS:

        def build(overrides=overrides):
            torch.manual_seed(0)
            return tiny_model(preset="small", attn_implementation="sdpa", **overrides)

        def batch():
            torch.manual_seed(1)
            input_ids, attention_mask, decoder_input_ids = padded_batch()
            labels = torch.cat([decoder_input_ids[:, 1:], torch.full_like(decoder_input_ids[:, :1], 2)], 1)
            return dict(
                input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, labels=labels
            )

        cases.append(pytest.param(build, batch, id=f"transformer-{overrides['norm_order']}"))
    return cases


def _on(batch: dict, device: str) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    grads = {n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach().float().cpu(), out.loss.detach().float().cpu(), grads


@pytest.mark.parametrize("build, make_batch", _family_cases())
def test_forward_and_backward_on_the_device_equal_the_cpu(device, build, make_batch):
    batch = make_batch()
    # eval(): no dropout, so the two runs do the same arithmetic (backward works the same).
    cpu_model = build().eval()
    device_model = build().to(device).eval()
    logits_cpu, loss_cpu, grads_cpu = _loss_and_grads(cpu_model, batch)
    logits_dev, loss_dev, grads_dev = _loss_and_grads(device_model, _on(batch, device))
    torch.testing.assert_close(logits_dev, logits_cpu, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(loss_dev, loss_cpu, atol=1e-5, rtol=1e-5)
    assert grads_dev.keys() == grads_cpu.keys() and grads_cpu
    for name in grads_cpu:
        scale = grads_cpu[name].abs().max().clamp_min(1e-6)
        torch.testing.assert_close(
            grads_dev[name] / scale, grads_cpu[name] / scale, atol=1e-3, rtol=0, msg=lambda m, n=name: f"{n}: {m}"
        )


@pytest.mark.parametrize("num_beams", [1, 5])
@pytest.mark.parametrize("build, make_batch", _family_cases())
def test_generate_on_the_device_gives_the_cpus_tokens(device, build, make_batch, num_beams):
    batch = make_batch()
    kwargs = dict(
        num_beams=num_beams, do_sample=False, max_new_tokens=8, return_dict_in_generate=True, output_scores=True
    )
    cpu_model, device_model = build().eval(), build().to(device).eval()
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    with torch.inference_mode():
        on_cpu = cpu_model.generate(**inputs, **kwargs)
        on_device = device_model.generate(**_on(inputs, device), **kwargs)
    assert torch.equal(on_device.sequences.cpu(), on_cpu.sequences)
    if num_beams > 1:
        torch.testing.assert_close(on_device.sequences_scores.cpu(), on_cpu.sequences_scores, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("overrides", TRANSFORMER_VARIANTS, ids=lambda o: o["norm_order"])
def test_eager_and_sdpa_attention_agree_on_the_device(device, overrides):
    torch.manual_seed(1)
    input_ids, attention_mask, decoder_input_ids = (t.to(device) for t in padded_batch())
    logits = {}
    for implementation in ("eager", "sdpa"):
        torch.manual_seed(0)
        model = tiny_model(preset="small", attn_implementation=implementation, **overrides).to(device)
        with torch.inference_mode():
            logits[implementation] = (
                model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
                .logits.float()
                .cpu()
            )
    torch.testing.assert_close(logits["sdpa"], logits["eager"], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("build, make_batch", _family_cases())
def test_autocast_training_step_is_finite_and_close_to_float32(device, build, make_batch, dtype):
    batch = _on(make_batch(), device)
    model = build().to(device).eval()  # no dropout: the float32 and the autocast forward compare alike
    _, loss32, _ = _loss_and_grads(model, batch)
    model.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=dtype):
        out = model(**batch)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert torch.isfinite(out.loss).item() and out.logits.isfinite().all().item()
    assert grads and all(g.isfinite().all().item() for g in grads)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast keeps float32 weights
    # 16-bit matmuls change the loss of a tiny model by well under 5%.
    assert abs(out.loss.float().item() - loss32.item()) <= 0.05 * loss32.item()


@pytest.mark.parametrize("build, make_batch", _family_cases())
def test_save_on_the_device_and_load_back_give_identical_logits(device, build, make_batch, tmp_path):
    batch = _on(make_batch(), device)
    model = build().to(device).eval()
    model.save_pretrained(tmp_path)
    cls = (
        RNNSeq2SeqForConditionalGeneration
        if isinstance(model, RNNSeq2SeqForConditionalGeneration)
        else TransformerSeq2SeqForConditionalGeneration
    )
    loaded = cls.from_pretrained(tmp_path).to(device).eval()
    with torch.inference_mode():
        before, after = model(**batch).logits, loaded(**batch).logits
    assert after.device.type == torch.device(device).type
    assert torch.equal(before, after)
