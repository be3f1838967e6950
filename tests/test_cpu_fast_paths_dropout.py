"""Behaviour of the CPU dropout (modeling/cpu_fast_paths.py): the distribution of the mask, its
scaling, gradients, reproducibility and the cases it hands to `F.dropout`."""

from __future__ import annotations

import pytest
import torch

from attention_seq2seq.modeling.cpu_fast_paths import dropout, dropout_keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_each_element_is_dropped_with_probability_p_in_every_lane(p):
    torch.manual_seed(0)
    mask = dropout_keep_mask(torch.Size((512, 1024)), p, torch.float32, torch.device("cpu"))
    values = mask.unique().tolist()
    rounded = round(p * 2**15) / 2**15  # p at 15-bit resolution; the scale uses it
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(1.0 / (1.0 - rounded), rel=1e-6)
    dropped = mask == 0
    # four elements come from one 64-bit draw; each lane (index mod 4) must be fair on its own
    # (the top lane's sign bit is always 0: an unmasked compare would drop ~50% of the others)
    lanes = dropped.reshape(-1, 4).float().mean(dim=0)
    sigma = (p * (1 - p) / (dropped.numel() / 4)) ** 0.5
    assert torch.all((lanes - p).abs() < 6 * sigma), lanes
    # lanes of the same draw are independent: P(both dropped) = p² for every pair of lanes
    quads = dropped.reshape(-1, 4)
    for a in range(4):
        for b in range(a + 1, 4):
            both = (quads[:, a] & quads[:, b]).float().mean().item()
            assert abs(both - p * p) < 6 * (p * p * (1 - p * p) / quads.size(0)) ** 0.5, (a, b)


def test_dropout_keeps_the_expectation_and_the_gradient_is_the_mask():
    torch.manual_seed(0)
    x = torch.randn(256, 1024, dtype=torch.float64, requires_grad=True)
    y = dropout(x, 0.2, training=True)
    kept = y != 0
    keep = 1.0 - round(0.2 * 2**15) / 2**15  # 0.2 at 15-bit resolution
    torch.testing.assert_close(y[kept], x[kept] / keep)
    assert abs(kept.double().mean().item() - keep) < 0.005
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(x.grad, kept.double() / keep)


def test_masks_follow_the_global_seed_and_differ_between_calls():
    x = torch.ones(64, 64)
    torch.manual_seed(7)
    first, second = dropout(x, 0.5), dropout(x, 0.5)
    torch.manual_seed(7)
    assert torch.equal(dropout(x, 0.5), first)
    assert not torch.equal(first, second)


def test_identity_at_inference_or_p_zero_and_zero_at_p_one():
    x = torch.randn(3, 5)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    # p so close to 1 that it rounds to 1 at 15 bits drops everything (an int16 threshold of
    # 32,768 would wrap around and keep everything, scaled by 1/(1 - p))
    assert torch.equal(dropout(x, 1.0 - 1e-6), torch.zeros_like(x))
    with pytest.raises(ValueError, match="rounds to 1"):
        dropout_keep_mask(x.shape, 1.0 - 1e-6, x.dtype, x.device)


def test_largest_and_smallest_representable_p_keep_the_expectation():
    torch.manual_seed(0)
    x = torch.ones(1 << 20, dtype=torch.float64)
    high = dropout(x, 1.0 - 2**-15)  # keeps one element in 32,768, scaled by 32,768
    assert set(high.unique().tolist()) <= {0.0, 32768.0} and 0 < (high > 0).sum() < 100
    assert torch.equal(dropout(x, 1e-6), x)  # rounds to p = 0: everything kept, scale 1


def test_odd_sizes_zero_dim_and_non_contiguous_inputs():
    torch.manual_seed(0)
    for x in (torch.ones(7), torch.ones(()), torch.ones(5, 6).t(), torch.ones(0, 3)):
        y = dropout(x, 0.5)
        assert y.shape == x.shape and set(y.unique().tolist()) <= {0.0, 2.0}


def test_half_precision_input_keeps_its_dtype():
    torch.manual_seed(0)
    x = torch.ones(64, 64, dtype=torch.bfloat16)
    y = dropout(x, 0.5)
    assert y.dtype == torch.bfloat16
    assert set(y.unique().float().tolist()) == {0.0, 2.0}


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_probability_outside_zero_one_raises(p):
    with pytest.raises(ValueError, match=f"between 0 and 1, but got {p}"):
        dropout(torch.ones(2), p)
