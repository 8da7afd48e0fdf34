"""GPT-NeoX's Lion and madgrad_wd against independent implementations: lucidrains' lion-pytorch (the update
NeoX's megatron/optimizers.py writes out) and Facebook's madgrad package (without weight decay: its decoupled
decay applies after the step from the old weights, NeoX's before it), and NeoX's decay worked by hand."""

from __future__ import annotations

import math

import pytest
import torch
from lion_pytorch import Lion as ReferenceLion
from madgrad import MADGRAD
from nxd_precision.neox_optimizers import Lion, MadgradWD


def _run(optimizer_class, options: dict, steps: int = 6) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1)).double()
    optimizer = optimizer_class(model.parameters(), **options)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        inputs = torch.randn(16, 6, generator=generator, dtype=torch.float64)
        loss = model(inputs).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def test_lion_steps_as_lion_pytorch():
    options = {"lr": 0.01, "betas": (0.9, 0.99), "weight_decay": 0.1}
    for ours, reference in zip(_run(Lion, options), _run(ReferenceLion, options), strict=True):
        assert torch.allclose(ours, reference, rtol=0, atol=1e-12)


@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_madgrad_steps_as_facebooks_madgrad(momentum):
    options = {"lr": 0.01, "momentum": momentum, "eps": 1e-6}
    for ours, reference in zip(_run(MadgradWD, options), _run(MADGRAD, options), strict=True):
        assert torch.allclose(ours, reference, rtol=0, atol=1e-12)


def test_madgrad_decays_the_weights_before_the_step_as_neox_does():
    """One step on one value x = 2 with gradient g = 3, lr 0.1, eps 0, decay 0.5, momentum 0.9 (by hand):
    x is decayed to 2 (1 - 0.1 x 0.5) = 1.9; the sum of squares is 0.1 x 9 = 0.9, s = 0.1 x 3 = 0.3,
    z = x0 - s / 0.9^(1/3) with x0 = 2 (the start), and x = 0.9 x 1.9 + 0.1 z."""
    weight = torch.nn.Parameter(torch.tensor([2.0], dtype=torch.float64))
    optimizer = MadgradWD([weight], lr=0.1, momentum=0.9, weight_decay=0.5, eps=0.0)
    weight.grad = torch.tensor([3.0], dtype=torch.float64)
    optimizer.step()
    z = 2.0 - 0.3 / 0.9 ** (1 / 3)
    assert math.isclose(weight.item(), 0.9 * 1.9 + 0.1 * z, rel_tol=1e-12)
