"""Every optimizer name: the class it builds, its parameters, weight-decay groups, a real step."""

from __future__ import annotations

import math

import pytest
import torch
from nxd_precision import Novograd, PrecisionConfigError, build_optimizer
from nxd_precision.adam8bit import Adam8bit
from nxd_precision.neox_optimizers import SM3, Lion, MadgradWD
from nxd_precision.optimizers import OPTIMIZER_NAMES, parameter_groups
from transformers.optimization import Adafactor

CASES = {
    "adamw": (
        {"lr": 0.01, "betas": (0.8, 0.9), "eps": 1e-6, "amsgrad": True},
        torch.optim.AdamW,
        {"betas": (0.8, 0.9), "eps": 1e-6, "amsgrad": True},
    ),
    "adamw_fp32OptState": ({"lr": 0.01}, torch.optim.AdamW, {"betas": (0.9, 0.999)}),
    "adam": ({"lr": 0.01, "weight_decay": 0.1}, torch.optim.Adam, {"weight_decay": 0.1}),
    "sgd": ({"lr": 0.1, "momentum": 0.9, "nesterov": True}, torch.optim.SGD, {"momentum": 0.9, "nesterov": True}),
    "adadelta": ({"lr": 1.0, "rho": 0.8, "eps": 1e-5}, torch.optim.Adadelta, {"rho": 0.8, "eps": 1e-5}),
    "adamax": ({"lr": 0.01, "betas": (0.7, 0.9)}, torch.optim.Adamax, {"betas": (0.7, 0.9)}),
    "adagrad": (
        {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1},
        torch.optim.Adagrad,
        {"lr_decay": 0.01, "initial_accumulator_value": 0.1},
    ),
    "rmsprop": (
        {"lr": 0.01, "alpha": 0.9, "centered": True, "momentum": 0.5},
        torch.optim.RMSprop,
        {"alpha": 0.9, "centered": True, "momentum": 0.5},
    ),
    "rprop": (
        {"lr": 0.01, "etas": (0.4, 1.5), "step_sizes": (1e-5, 10.0)},
        torch.optim.Rprop,
        {"etas": (0.4, 1.5), "step_sizes": (1e-5, 10.0)},
    ),
    "novograd": ({"lr": 0.01, "betas": (0.9, 0.99), "luc": True}, Novograd, {"betas": (0.9, 0.99), "luc": True}),
    "lion": ({"lr": 0.003, "betas": (0.95, 0.98), "weight_decay": 0.1}, Lion, {"betas": (0.95, 0.98)}),
    "madgrad_wd": ({"lr": 0.01, "momentum": 0.8, "eps": 1e-6, "weight_decay": 0.01}, MadgradWD, {"momentum": 0.8}),
    "sm3": ({"lr": 0.05, "momentum": 0.5, "beta": 0.9, "weight_decay": 0.01}, SM3, {"momentum": 0.5, "beta": 0.9}),
    "adam8bit": (
        {"lr": 0.01, "betas": (0.8, 0.9), "eps": 1e-6, "min_8bit_size": 16},
        Adam8bit,
        {"betas": (0.8, 0.9), "min_8bit_size": 16},
    ),
    "adafactor": (
        {
            "lr": 0.01,
            "beta1": 0.9,
            "clip_threshold": 0.5,
            "scale_parameter": False,
            "decay_rate": 0.8,
            "relative_step": False,
        },
        Adafactor,
        {"beta1": 0.9, "clip_threshold": 0.5, "scale_parameter": False, "decay_rate": -0.8},
    ),
}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 1))


@pytest.mark.parametrize("name", sorted(CASES))
def test_optimizer_is_built_with_its_parameters_and_learns(name):
    config, cls, expected = CASES[name]
    model = _model()
    optimizer = build_optimizer(name, model.parameters(), config, decay_norms_and_biases=False)
    assert type(optimizer) is cls
    group = optimizer.param_groups[0]
    for key, value in expected.items():
        assert group[key] == value, key
    inputs, targets = torch.randn(64, 8), torch.randn(64, 1)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[-1] < losses[0]


def test_every_optimizer_name_has_a_case():
    assert set(CASES) == set(OPTIMIZER_NAMES)


def test_an_unknown_name_is_refused_with_the_valid_ones():
    with pytest.raises(PrecisionConfigError, match="model.optim.name: expected one of adamw, .*, found 'adamx'"):
        build_optimizer("adamx", _model().parameters(), {"lr": 0.1}, decay_norms_and_biases=False)


def test_norm_weights_and_biases_get_no_weight_decay_unless_asked():
    model = _model()
    groups = parameter_groups(model.parameters(), 0.1, decay_norms_and_biases=False)
    assert [len(g["params"]) for g in groups] == [2, 4]  # two weight matrices; 2 biases + norm weight and bias
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    everything = parameter_groups(model.parameters(), 0.1, decay_norms_and_biases=True)
    assert len(everything) == 1 and len(everything[0]["params"]) == 6


def test_adafactor_relative_step_needs_no_lr():
    optimizer = build_optimizer(
        "adafactor",
        _model().parameters(),
        {"lr": None, "relative_step": True, "warmup_init": True},
        decay_norms_and_biases=False,
    )
    assert optimizer.param_groups[0]["relative_step"] and optimizer.param_groups[0]["lr"] is None


def test_novograd_two_steps_by_hand():
    """NeMo's NovoGrad on f(p) = |p|^2 / 2 (gradient p), worked with plain floats."""
    param = torch.nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.float64))
    optimizer = Novograd([param], lr=0.1, betas=(0.95, 0.98), eps=1e-8, weight_decay=0.01)
    p, m, v = [1.0, 2.0], [0.0, 0.0], None
    for _ in range(2):
        norm = sum(x * x for x in p)
        v = norm if v is None else 0.98 * v + 0.02 * norm
        update = [x / (math.sqrt(v) + 1e-8) + 0.01 * x for x in p]
        m = [0.95 * a + u for a, u in zip(m, update, strict=True)]
        p = [x - 0.1 * a for x, a in zip(p, m, strict=True)]
        optimizer.zero_grad()
        (param.pow(2).sum() / 2).backward()
        optimizer.step()
    assert param.tolist() == pytest.approx(p, abs=1e-12)


@pytest.mark.parametrize("precision", ["bf16SR", "mixed_precisionSR"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_optimizer_learns_on_bf16_parameters(name, precision):
    """nxd-precision's wrapper steps each optimizer on fp32 copies and rounds back stochastically."""
    from nxd_precision import PrecisionOptimizer, prepare_parameters, resolve_policy

    config, _, _ = CASES[name]
    policy = resolve_policy(precision, fp32_optimizer_state=name == "adamw_fp32OptState")
    model = _model()
    prepare_parameters(model, policy)
    optimizer = PrecisionOptimizer(
        model.parameters(), policy, lambda tensors: build_optimizer(name, tensors, config, decay_norms_and_biases=False)
    )
    inputs, targets = torch.randn(64, 8, dtype=torch.bfloat16), torch.randn(64, 1)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.mse_loss(model(inputs).float(), targets)
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[-1] < losses[0]
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
