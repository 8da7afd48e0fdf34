"""Stochastic rounding: unbiased by a statistical test, exact on representable values, and the reason
it exists — bf16 updates below half a bf16 step stall under round-to-nearest and do not under it."""

from __future__ import annotations

import math

import pytest
import torch
from nxd_precision import stochastic_round


@pytest.mark.parametrize("value", [1.0 + 0.3 * 2**-7, -3.7e-3, 1234.56, 2.0**-100 * 1.77, -0.1])
def test_the_mean_of_rounded_values_is_the_value(value: float) -> None:
    samples = 200_000
    x = torch.full((samples,), value, dtype=torch.float32)
    rounded = stochastic_round(x, torch.Generator().manual_seed(0)).double()
    lower, upper = rounded.min().item(), rounded.max().item()
    assert lower <= value <= upper and len(torch.unique(rounded)) <= 2  # only the two bf16 neighbours
    p = (value - lower) / (upper - lower)  # Bernoulli(p) choice of the upper neighbour
    sigma = (upper - lower) * math.sqrt(p * (1 - p) / samples)
    assert abs(rounded.mean().item() - value) < 5 * sigma
    assert abs(x.to(torch.bfloat16).double().mean().item() - value) > 5 * sigma  # round-to-nearest is biased


def test_representable_and_special_values_are_kept() -> None:
    exact = torch.tensor([0.0, -0.0, 1.0, -2.5, 2.0**-120, 2.0**127 * 1.5], dtype=torch.float32)
    assert torch.equal(stochastic_round(exact), exact.to(torch.bfloat16))
    special = stochastic_round(torch.tensor([float("inf"), float("-inf"), float("nan")]))
    assert special[0] == float("inf") and special[1] == float("-inf") and special[2].isnan()


def test_updates_below_half_a_step_stall_with_round_to_nearest_but_not_stochastically() -> None:
    # 1000 steps of -1e-4 from 1.0: bf16's spacing at 1 is 2**-7 = 7.8e-3, so each step is 1/78 of it
    nearest = torch.ones(256, dtype=torch.bfloat16)
    stochastic = torch.ones(256, dtype=torch.bfloat16)
    generator = torch.Generator().manual_seed(1)
    for _ in range(1000):
        nearest = (nearest.float() - 1e-4).to(torch.bfloat16)
        stochastic = stochastic_round(stochastic.float() - 1e-4, generator)
    assert torch.all(nearest == 1.0)
    assert abs(stochastic.float().mean().item() - 0.9) < 0.01


def _from_bits(*words: int) -> torch.Tensor:
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32).view(torch.float32)


def test_nans_whose_payload_lies_in_the_low_half_stay_nan() -> None:
    # 0x7F800001 would truncate to inf, 0x7FFFFFFF and 0xFFFFFFFF would carry into the sign or wrap to zero
    nans = _from_bits(0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000)
    for seed in range(20):
        assert stochastic_round(nans, torch.Generator().manual_seed(seed)).isnan().all()
    # a NaN among finite values, and finite values whose sum overflows: each element still rounds to a neighbour
    mixed = torch.cat([torch.tensor([3e38, 3e38, 1.0 + 2**-9]), _from_bits(0x7F800001)])
    rounded = stochastic_round(mixed, torch.Generator().manual_seed(0)).float()
    assert rounded[:2].isfinite().all() and rounded[2] in (1.0, 1.0 + 2**-7) and rounded[3].isnan()


@pytest.mark.parametrize("count", [0, 1, 3, 5, 6, 7, 4099])
def test_every_size_rounds_each_element_to_one_of_its_bf16_neighbours(count: int) -> None:
    values = torch.linspace(-3, 3, count, dtype=torch.float32) + 2**-11
    rounded = stochastic_round(values, torch.Generator().manual_seed(count)).double().tolist()
    for value, result in zip(values.double().tolist(), rounded, strict=True):
        spacing = 2.0 ** (math.frexp(value)[1] - 8)  # bf16 keeps 8 significant bits
        lower = math.floor(value / spacing) * spacing
        assert result in (lower, lower + spacing), (value, result)


def test_the_noise_is_uniform_over_the_low_half() -> None:
    # every 16-bit value equally likely: chi-square over 256 bins of the low-half rounding noise of 2**20 draws
    from nxd_precision.stochastic_rounding import _random_low_bits

    noise = _random_low_bits(2**20 + 3, torch.device("cpu"), torch.Generator().manual_seed(3))
    assert noise.min() >= 0 and noise.max() < 2**16
    counts = torch.bincount(noise // 256, minlength=256).double()
    expected = noise.numel() / 256
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 255 + 5 * math.sqrt(2 * 255)  # mean 255, sd sqrt(510)
    low = torch.bincount(noise % 256, minlength=256).double()  # the low byte too (each half of each draw)
    assert ((low - expected) ** 2 / expected).sum().item() < 255 + 5 * math.sqrt(2 * 255)
