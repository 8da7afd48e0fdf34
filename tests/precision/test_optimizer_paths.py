"""The fused and foreach optimizer implementations nxd picks give what torch's for-loop gives, and the
pick follows the parameters: fused where a kernel exists, foreach for one kind of tensor, the
for-loop for a mix of DTensors and plain tensors."""

from __future__ import annotations

import pytest
import torch
from nxd_precision import build_optimizer
from nxd_precision.optimizers import implementation, optimizer_arguments, optimizer_class

OPTIONS = {
    "adamw": {"lr": 1e-2, "weight_decay": 0.1, "betas": (0.9, 0.95)},
    "adam": {"lr": 1e-2, "weight_decay": 0.01},
    "sgd": {"lr": 1e-1, "momentum": 0.9, "weight_decay": 0.01},
    "adagrad": {"lr": 1e-1, "weight_decay": 0.01},
    "rmsprop": {"lr": 1e-2, "weight_decay": 0.01},
    "adamax": {"lr": 1e-2, "weight_decay": 0.01},
    "adadelta": {"lr": 1.0, "weight_decay": 0.01},
}


def _parameters() -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(0)
    shapes = [(64, 32), (32,), (128, 64), (64,), (7, 3, 5)]
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in shapes]


def _train(optimizer: torch.optim.Optimizer, parameters: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    for _ in range(6):
        for parameter in parameters:
            parameter.grad = torch.randn(parameter.shape, generator=generator)
        optimizer.step()
    return [parameter.detach().clone() for parameter in parameters]


@pytest.mark.parametrize("name", OPTIONS)
def test_the_chosen_implementation_gives_the_for_loops_result(name):
    chosen = _parameters()
    picked = implementation(name, chosen)
    assert picked == ({"fused": True} if name in ("adamw", "adam", "sgd", "adagrad") else {"foreach": True})
    found = _train(build_optimizer(name, chosen, OPTIONS[name], decay_norms_and_biases=False), chosen)
    reference = _parameters()
    arguments = optimizer_arguments(name, OPTIONS[name])
    decay = arguments.pop("weight_decay")
    groups = [
        {"params": [p for p in reference if p.ndim > 1], "weight_decay": decay},
        {"params": [p for p in reference if p.ndim == 1], "weight_decay": 0.0},
    ]
    expected = _train(optimizer_class(name)(groups, foreach=False, **arguments), reference)
    for mine, theirs in zip(found, expected, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7)


class _Sharded(torch.Tensor):
    """Stands for a DTensor: another tensor type, on a device mesh."""

    device_mesh = "mesh"


def test_a_mix_of_tensor_kinds_takes_the_for_loop():
    plain = torch.nn.Parameter(torch.ones(2))
    sharded = torch.ones(2).as_subclass(_Sharded)
    assert implementation("adamw", [plain, plain]) == {"fused": True}
    assert implementation("adamw", [plain, sharded]) == {"foreach": False}
    assert implementation("rmsprop", [sharded, sharded]) == {"foreach": True}
    assert implementation("novograd", [plain]) == {}  # NeMo's own step
    assert implementation("adamw", [torch.ones(2, dtype=torch.float64), torch.ones(2, device="meta")]) == {
        "foreach": False
    }
