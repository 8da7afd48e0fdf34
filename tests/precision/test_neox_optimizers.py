"""GPT-NeoX's Lion, madgrad_wd and SM3 against independent implementations: lucidrains' lion-pytorch (the update
NeoX's megatron/optimizers.py writes out), Facebook's madgrad package (without weight decay: its decoupled
decay applies after the step from the old weights, NeoX's before it) and kozistr's pytorch-optimizer SM3, and
NeoX's decay and SM3's accumulators worked by hand."""

from __future__ import annotations

import math

import pytest
import torch
from lion_pytorch import Lion as ReferenceLion
from madgrad import MADGRAD
from nxd_precision.neox_optimizers import SM3, Lion, MadgradWD


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


class _Cube(torch.nn.Module):
    """A 3-axis weight (three accumulators), a matrix, a vector and a scalar: every rank SM3 treats."""

    def __init__(self, scalar: bool = True) -> None:
        super().__init__()
        self.cube = torch.nn.Parameter(torch.randn(2, 3, 4, dtype=torch.float64))
        self.linear = torch.nn.Linear(3, 4).double()
        self.scale = torch.nn.Parameter(torch.tensor(0.5, dtype=torch.float64), requires_grad=scalar)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return (self.linear(torch.einsum("bk,ijk->bij", inputs, self.cube).tanh()) * self.scale).square().mean()


def _run_cube(optimizer_class, options: dict, steps: int = 5) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = _Cube(scalar=options["beta"] == 0)
    optimizer = optimizer_class([p for p in model.parameters() if p.requires_grad], **options)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 4, generator=generator, dtype=torch.float64)).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(("momentum", "beta"), [(0.0, 0.0), (0.5, 0.0), (0.0, 0.9), (0.9, 0.5)])
def test_sm3_steps_as_pytorch_optimizers_sm3(momentum, beta):
    """kozistr's pytorch-optimizer SM3 (from the authors' code, as NeoX's is) on tensors of ranks 0 to 3. With
    beta > 0 it sets a scalar's accumulator to nu where NeoX keeps the greater of the two (as for every other
    rank): the scalar is left out there, and checked by hand below."""
    from pytorch_optimizer import SM3 as ReferenceSM3

    options = {"lr": 0.05, "momentum": momentum, "beta": beta, "eps": 1e-30}
    ours = _run_cube(SM3, options)
    reference = _run_cube(lambda params, **kw: ReferenceSM3(params, foreach=False, **kw), options)
    for mine, theirs in zip(ours, reference, strict=True):
        assert torch.allclose(mine, theirs, rtol=0, atol=1e-12)
    assert not torch.equal(ours[0], _Cube().cube.detach())  # it moved


def test_sm3_by_hand_on_a_matrix():
    """A 2x2 weight from 0, lr 0.1, eps 0. Step 1, g = [[1, 2], [3, 4]]: nu = g^2, so the update is g / |g| = 1
    everywhere; the row accumulators become max(1, 4) = 4 and max(9, 16) = 16, the columns 9 and 16. Step 2,
    g = 1: nu = min(row, column) + 1 = [[5, 5], [10, 17]] and the update is 1 / sqrt(nu)."""
    weight = torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.float64))
    optimizer = SM3([weight], lr=0.1, eps=0.0)
    for grad in (torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.ones(2, 2)):
        weight.grad = grad.double()
        optimizer.step()
    state = optimizer.state[weight]
    assert state["accumulator_0"].flatten().tolist() == [5.0, 17.0]  # the greatest nu per row after step 2
    assert state["accumulator_1"].flatten().tolist() == [10.0, 17.0]
    expected = -0.1 - 0.1 / torch.tensor([[5.0, 5.0], [10.0, 17.0]], dtype=torch.float64).sqrt()
    assert torch.allclose(weight.detach(), expected, rtol=0, atol=1e-15)


def test_sm3_weight_decay_multiplies_the_weights_first():
    """x = 2, g = 3, lr 0.1, decay 0.5, eps 0: x (1 - 0.05) = 1.9, then 1.9 - 0.1 x 3 / 3 = 1.8."""
    weight = torch.nn.Parameter(torch.tensor([2.0], dtype=torch.float64))
    optimizer = SM3([weight], lr=0.1, weight_decay=0.5, eps=0.0)
    weight.grad = torch.tensor([3.0], dtype=torch.float64)
    optimizer.step()
    assert math.isclose(weight.item(), 1.8, rel_tol=1e-15)


def test_sm3_keeps_a_scalars_greatest_accumulator_with_beta_as_neox_does():
    """beta 0.5, eps 0: step 1, g = 2: nu = 0.5 x 2^2 = 2 (accumulator 2); step 2, g = 0: nu = 0.5 x 2 = 1, and the
    accumulator stays max(2, 1) = 2."""
    weight = torch.nn.Parameter(torch.tensor(1.0, dtype=torch.float64))
    optimizer = SM3([weight], lr=0.1, beta=0.5, eps=0.0)
    for grad in (2.0, 0.0):
        weight.grad = torch.tensor(grad, dtype=torch.float64)
        optimizer.step()
    assert optimizer.state[weight]["accumulator_0"].item() == 2.0
    assert math.isclose(weight.item(), 1.0 - 0.1 * 2 / math.sqrt(2), rel_tol=1e-15)
