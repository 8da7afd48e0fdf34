"""bitsandbytes' 8-bit Adam (model.optim.name adam8bit) against bitsandbytes' own Adam8bit class: the same
kernels, stepped on whole tensors, give the same weights; its state survives torch's state_dict round trip as 8-bit
codes; the devices and installs where it cannot step are named."""

from __future__ import annotations

import builtins
import copy

import bitsandbytes as bnb
import pytest
import torch
from nxd_precision import adam8bit_support_problem
from nxd_precision.adam8bit import Adam8bit


def _model() -> torch.nn.Module:
    torch.manual_seed(0)  # 40 x 64 + 40 values: one tensor over min_8bit_size 1000 (8-bit), one under (fp32)
    return torch.nn.Sequential(torch.nn.Linear(64, 40), torch.nn.Tanh(), torch.nn.Linear(40, 3))


def _steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, start: int, stop: int) -> None:
    for step in range(start, stop):
        generator = torch.Generator().manual_seed(step)
        loss = model(torch.randn(16, 64, generator=generator)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_steps_as_bitsandbytes_adam8bit():
    options = {"lr": 0.01, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.1, "min_8bit_size": 1000}
    ours, reference = _model(), _model()
    optimizer = Adam8bit(ours.parameters(), **options)
    _steps(ours, optimizer, 0, 6)
    _steps(reference, bnb.optim.Adam8bit(reference.parameters(), **options), 0, 6)
    for mine, theirs in zip(ours.parameters(), reference.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    assert {str(state["exp_avg"].dtype) for state in optimizer.state.values()} == {"torch.uint8", "torch.float32"}
    big = optimizer.state[ours[0].weight]  # 2560 values: 10 blocks of 256, one fp32 scale each per moment
    assert big["absmax_exp_avg"].shape == big["absmax_exp_avg_sq"].shape == (10,)


def test_the_first_moment_is_the_gradients_share_to_within_one_code():
    """After one step the first moment is (1 - beta1) g (Adam's), held as one of 256 codes per block scaled by the
    block's absolute maximum (which itself is exact): within the widest gap between neighbouring codes of
    bitsandbytes' signed dynamic map, times that maximum."""
    model = _model()
    optimizer = Adam8bit(model.parameters(), lr=0.0, betas=(0.9, 0.999), min_8bit_size=0)
    _steps(model, optimizer, 0, 1)
    weight = model[0].weight
    state = optimizer.state[weight]
    codes = bnb.functional.create_dynamic_map(signed=True)
    moment = (codes[state["exp_avg"].long()].flatten().view(-1, 256) * state["absmax_exp_avg"][:, None]).flatten()
    expected = 0.1 * weight.grad.flatten()
    assert torch.allclose(state["absmax_exp_avg"], expected.abs().view(-1, 256).amax(dim=1))
    gap = codes.sort().values.diff().max()
    assert ((moment - expected).abs() <= gap * state["absmax_exp_avg"].repeat_interleave(256) + 1e-9).all()


def test_a_loaded_state_keeps_its_codes_and_steps_on_equally():
    model = _model()
    optimizer = Adam8bit(model.parameters(), lr=0.01, min_8bit_size=1000)
    _steps(model, optimizer, 0, 3)
    saved, weights = copy.deepcopy(optimizer.state_dict()), copy.deepcopy(model.state_dict())
    _steps(model, optimizer, 3, 5)
    other = _model()
    other.load_state_dict(weights)
    resumed = Adam8bit(other.parameters(), lr=0.01, min_8bit_size=1000)
    resumed.load_state_dict(saved)
    assert resumed.state[other[0].weight]["exp_avg"].dtype == torch.uint8
    _steps(other, resumed, 3, 5)
    for mine, theirs in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(mine, theirs)


def test_devices_without_its_kernels_and_a_missing_install_are_named(monkeypatch):
    assert adam8bit_support_problem("cpu") is None
    assert adam8bit_support_problem("meta") == (
        "model.optim.name: adam8bit expected a device bitsandbytes' installed build has 8-bit optimizer kernels for "
        "(the CPU; CUDA and XPU in builds for them), found meta; use adamw on this device"
    )
    importing = builtins.__import__

    def without_bitsandbytes(name, *args, **kwargs):
        if name.startswith("bitsandbytes"):
            raise ImportError(name)
        return importing(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_bitsandbytes)
    assert adam8bit_support_problem("cpu") == (
        "model.optim.name: adam8bit expected the bitsandbytes package, found "
        "it not installed; install nxd-train[bnb] (pip install bitsandbytes)"
    )


def test_invalid_hyperparameters_are_named():
    with pytest.raises(ValueError, match="adam8bit: expected .* found lr 0.01, betas \\(0.9, 1.0\\)"):
        Adam8bit(_model().parameters(), lr=0.01, betas=(0.9, 1.0))


def test_flagged_parameters_keep_fp32_moments_through_a_resume():
    """The model family's fp32_state_parameters (bitsandbytes' StableEmbedding tables) step with fp32 moments
    however large, as bitsandbytes' optim_bits 32 override makes them; the flag is kept in the saved groups."""
    from nxd_precision import build_optimizer

    model = _model()
    options = {"lr": 0.01, "weight_decay": 0.1, "min_8bit_size": 1000}
    flags = [True, False, False, False]  # the first layer's 2560 weights
    optimizer = build_optimizer("adam8bit", model.parameters(), options, decay_norms_and_biases=False, fp32_state=flags)
    _steps(model, optimizer, 0, 2)
    assert optimizer.state[model[0].weight]["exp_avg"].dtype == torch.float32
    assert optimizer.state[model[2].weight]["exp_avg"].dtype == torch.float32  # 120 values: under min_8bit_size
    assert [(len(group["params"]), group["fp32_state"]) for group in optimizer.param_groups] == [
        (1, False),
        (1, True),
        (2, False),
    ]  # the other weight, the flagged one, the biases (no decay)
    resumed = build_optimizer("adam8bit", model.parameters(), options, decay_norms_and_biases=False, fp32_state=flags)
    resumed.load_state_dict(optimizer.state_dict())
    assert resumed.state[model[0].weight]["exp_avg"].dtype == torch.float32
    assert [group["fp32_state"] for group in resumed.param_groups] == [False, True, False]
    from nxd_precision import apply_options

    apply_options(resumed, "adam8bit", {**options, "weight_decay": 0.2})  # a resumed run's own weight decay
    assert [group["weight_decay"] for group in resumed.param_groups] == [0.2, 0.2, 0.0]


def test_a_bf16_state_policy_leaves_its_fp32_scales_and_moments():
    """bf16SR rounds an optimizer's floating state to bf16 between steps; 8-bit Adam's block maxima and fp32
    moments are fp32 by bitsandbytes' design and stay so."""
    from nxd_precision import PrecisionOptimizer, prepare_parameters, resolve_policy

    policy = resolve_policy("bf16SR")
    assert policy.optimizer_state_dtype == torch.bfloat16
    model = _model()
    prepare_parameters(model, policy)
    optimizer = PrecisionOptimizer(
        model.parameters(), policy, lambda tensors: Adam8bit(tensors, lr=0.01, min_8bit_size=1000)
    )
    for step in range(2):
        inputs = torch.randn(16, 64, generator=torch.Generator().manual_seed(step)).bfloat16()
        loss = model(inputs).float().square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    states = list(optimizer.optimizer.state.values())
    assert {state["exp_avg"].dtype for state in states} == {torch.uint8, torch.float32}
    assert {
        value.dtype for state in states for key, value in state.items() if key != "step" and value.is_floating_point()
    } == {torch.float32}
