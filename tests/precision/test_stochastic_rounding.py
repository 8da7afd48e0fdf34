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
