"""Each precision type as dtypes, worked from the reference's definitions (policy.py's table)."""

from __future__ import annotations

import pytest
import torch
from nxd_precision import PrecisionConfigError, resolve_policy

F, B = torch.float32, torch.bfloat16
# type: param, compute, master, accumulation, reduction, optimizer state, stochastic rounding, TP reduction
TABLE = {
    "fp32": (F, F, None, F, F, F, False, F),
    "autocast": (F, B, None, F, F, F, False, B),
    "mixed_precision": (B, B, F, F, F, F, False, B),
    "mixed_precisionSR": (B, B, F, F, F, F, True, B),
    "bf16SR": (B, B, None, B, B, B, True, B),
}


@pytest.mark.parametrize("name", sorted(TABLE))
def test_each_type_means_what_the_reference_says(name: str) -> None:
    policy = resolve_policy(name)
    found = (
        policy.param_dtype,
        policy.compute_dtype,
        policy.master_dtype,
        policy.grad_accumulation_dtype,
        policy.grad_reduction_dtype,
        policy.optimizer_state_dtype,
        policy.stochastic_rounding,
        policy.parallel_layers_reduce_dtype,
    )
    assert found == TABLE[name]
    assert policy.autocast == (name == "autocast")


def test_fp32_optimizer_state_and_explicit_tensor_parallel_reduction() -> None:
    assert resolve_policy("bf16SR", fp32_optimizer_state=True).optimizer_state_dtype == F
    assert resolve_policy("fp32", parallel_layers_reduce_dtype=B).parallel_layers_reduce_dtype == B
    assert resolve_policy("mixed_precision", parallel_layers_reduce_dtype=F).parallel_layers_reduce_dtype == F


@pytest.mark.parametrize(
    ("knobs", "expected"),
    [
        ({}, (F, F, None, F, F, False)),
        ({"xla_downcast_bf16": True}, (F, B, None, F, F, False)),
        ({"xla_use_bf16": True}, (B, B, None, B, B, False)),
        ({"xla_use_bf16": True, "master_weights": True, "fp32_grad_acc": True}, (B, B, F, F, B, False)),
        ({"xla_use_bf16": True, "fp32_grads_cc": True, "stochastic_rounding": True}, (B, B, None, B, F, True)),
    ],
)
def test_manual_honours_each_knob(knobs: dict, expected: tuple) -> None:
    policy = resolve_policy("manual", **knobs)
    assert (
        policy.param_dtype,
        policy.compute_dtype,
        policy.master_dtype,
        policy.grad_accumulation_dtype,
        policy.grad_reduction_dtype,
        policy.stochastic_rounding,
    ) == expected


def test_contradictory_manual_knobs_are_named() -> None:
    with pytest.raises(PrecisionConfigError, match="xla_use_bf16 and precision.xla_downcast_bf16: expected at most"):
        resolve_policy("manual", xla_use_bf16=True, xla_downcast_bf16=True)
    with pytest.raises(PrecisionConfigError, match="master_weights: fp32 master weights need bf16 parameters"):
        resolve_policy("manual", master_weights=True)
    with pytest.raises(PrecisionConfigError, match="precision.type: expected one of fp32, .* found 'bf16'"):
        resolve_policy("bf16")


def test_a_device_without_bf16_is_named(monkeypatch) -> None:
    from nxd_precision import bf16_support_problem

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-16GB")
    message = bf16_support_problem(resolve_policy("mixed_precision"), torch.device("cuda"))
    assert message == (
        "precision.type: mixed_precision computes in bf16, which Tesla V100-SXM2-16GB does not "
        "support natively (compute capability 8.0 or newer); expected fp32 on this device"
    )
    assert bf16_support_problem(resolve_policy("fp32"), torch.device("cuda")) is None
    assert bf16_support_problem(resolve_policy("bf16SR"), torch.device("cpu")) is None
