"""PrecisionOptimizer: the dtypes of parameters, gradients, master weights and optimizer state after a
step for every type, and the stall that stochastic rounding prevents, in one process."""

from __future__ import annotations

import pytest
import torch
from nxd_precision import PrecisionOptimizer, prepare_parameters, resolve_policy
from torch import nn

F, B = torch.float32, torch.bfloat16


def train_step(type_name: str, fp32_state: bool = False, micro_batches: int = 2, **knobs):
    policy = resolve_policy(type_name, fp32_optimizer_state=fp32_state, **knobs)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    prepare_parameters(model, policy)
    optimizer = PrecisionOptimizer(model.parameters(), policy, lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False))
    for _ in range(micro_batches):
        model(torch.randn(3, 8, dtype=policy.param_dtype)).float().square().mean().backward()
    gradients = {p.grad.dtype for p in model.parameters()}  # as accumulated over the micro-batches
    optimizer.step()
    state = {v.dtype for s in optimizer.optimizer.state.values() for v in s.values() if v.ndim}
    return model, optimizer, gradients, state


@pytest.mark.parametrize(
    ("type_name", "fp32_state", "knobs", "expected"),
    [  # parameters, accumulated gradients, master weights, optimizer state
        ("fp32", False, {}, (F, F, None, F)),
        ("mixed_precision", False, {}, (B, F, F, F)),
        ("mixed_precisionSR", False, {}, (B, F, F, F)),
        ("bf16SR", False, {}, (B, B, None, B)),
        ("bf16SR", True, {}, (B, B, None, F)),  # adamw_fp32OptState
        ("manual", False, {"xla_use_bf16": True, "fp32_grad_acc": True}, (B, F, None, B)),
    ],
)
def test_dtypes_after_a_step(type_name, fp32_state, knobs, expected):
    model, optimizer, gradients, state = train_step(type_name, fp32_state, **knobs)
    masters = optimizer.copies if optimizer.persistent and optimizer.copies_needed else None
    found = (
        {p.dtype for p in model.parameters()},
        gradients,
        None if masters is None else {m.dtype for m in masters},
        state,
    )
    param, gradient, master, opt_state = expected
    assert found == ({param}, {gradient}, None if master is None else {master}, {opt_state})
    if not optimizer.persistent and optimizer.copies_needed:  # the step's fp32 copies hold no memory between steps
        assert all(c.untyped_storage().size() == 0 for c in optimizer.copies)


def test_bf16_gradients_accumulate_in_fp32_when_asked():
    """Two micro-batches whose bf16 gradients differ in size by 2**10: an fp32 sum keeps the small one."""
    weight = nn.Parameter(torch.ones(4))
    prepare_parameters(nn.ParameterList([weight]), resolve_policy("mixed_precision"))
    assert weight.dtype == B
    (weight * 256.0).sum().backward()
    (weight * 0.25).sum().backward()
    assert torch.equal(weight.grad, torch.full((4,), 256.25))  # a bf16 sum would give 256


def test_bf16_accumulation_over_fp32_masters_sums_in_bf16():
    """DeepSpeed's bf16 run with data_types.grad_accum_dtype bf16 (precision type manual: bf16 parameters, fp32
    masters, fp32_grad_acc False): over 4 micro-batches the gradient is the bf16 running sum of each micro-batch's
    bf16 gradient, bit for bit, and the fp32 masters take the step."""
    policy = resolve_policy("manual", xla_use_bf16=True, master_weights=True, fp32_grad_acc=False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    prepare_parameters(model, policy)
    inputs = [torch.randn(3, 8, dtype=B) * 4**index for index in range(4)]  # sizes apart: the sum's rounding shows
    expected = None
    for batch in inputs:  # each micro-batch's own gradient, summed in bf16 by hand
        own = torch.autograd.grad(model(batch).float().square().mean(), list(model.parameters()))
        expected = own if expected is None else [(a + b).to(B) for a, b in zip(expected, own, strict=True)]
    fp32_sum = [
        sum(
            torch.autograd.grad(model(batch).float().square().mean(), list(model.parameters()))[i].float()
            for batch in inputs
        )
        for i in range(4)
    ]
    optimizer = PrecisionOptimizer(model.parameters(), policy, lambda p: torch.optim.SGD(p, lr=1.0))
    for batch in inputs:
        model(batch).float().square().mean().backward()
    accumulated = [p.grad.clone() for p in model.parameters()]
    assert all(g.dtype == B for g in accumulated)
    assert all(torch.equal(a, e) for a, e in zip(accumulated, expected, strict=True))
    assert any(not torch.equal(a.float(), f) for a, f in zip(accumulated, fp32_sum, strict=True))  # not fp32's sum
    masters = [copy.detach().clone() for copy in optimizer.copies]
    optimizer.step()
    assert all(c.dtype == F for c in optimizer.copies)
    assert all(torch.equal(c, m - a.float()) for c, m, a in zip(optimizer.copies, masters, accumulated, strict=True))


def sgd_run(type_name: str, steps: int = 3000, **knobs) -> float:
    """Fit 512 bf16 weights from 1.0 towards 0.9 with SGD at lr 1e-4: each update (<= 2e-5) is far below
    half a bf16 step at 1.0 (3.9e-3)."""
    weights = nn.Parameter(torch.ones(512, dtype=B))
    optimizer = PrecisionOptimizer(
        [weights],
        resolve_policy(type_name, **knobs),
        lambda p: torch.optim.SGD(p, lr=1e-4),
        torch.Generator().manual_seed(0),
    )
    for _ in range(steps):
        (weights.float() - 0.9).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return weights.float().mean().item()


def test_plain_bf16_updates_stall_where_stochastic_rounding_and_masters_converge():
    expected = 0.9 + 0.1 * (1 - 2e-4) ** 3000  # the fp32 trajectory: 0.9549
    assert sgd_run("manual", xla_use_bf16=True) == 1.0  # round-to-nearest drops every update
    assert abs(sgd_run("bf16SR") - expected) < 0.005
    assert abs(sgd_run("mixed_precision") - expected) < 0.004  # fp32 masters, rounded for the forward


@pytest.mark.parametrize("type_name", ["fp32", "mixed_precision"])
def test_state_dict_by_name_restores_the_next_step(type_name):
    names = ["0.weight", "0.bias", "2.weight", "2.bias"]
    model, optimizer, _, _ = train_step(type_name)
    saved = optimizer.state_dict(names)
    assert sorted(saved["state"]) == sorted(names) and "params" not in saved["param_groups"]["0"]
    assert ("masters" in saved) == (type_name == "mixed_precision")
    fresh_model, fresh, _, _ = train_step(type_name, micro_batches=1)  # other weights and moments
    fresh.create_state()
    target = fresh.state_dict(names)
    with torch.no_grad():  # what a checkpoint load does: fill the live tensors in place
        for name, values in saved["state"].items():
            for key, value in values.items():
                target["state"][name][key].copy_(value)
        for name, master in saved.get("masters", {}).items():
            target["masters"][name].copy_(master)
        for mine, theirs in zip(fresh_model.parameters(), model.parameters(), strict=True):
            mine.copy_(theirs)
    fresh.load_state_dict(target, names)
    for opt, net in ((optimizer, model), (fresh, fresh_model)):
        opt.zero_grad()
        torch.manual_seed(5)
        net(torch.randn(3, 8, dtype=opt.policy.param_dtype)).float().square().mean().backward()
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh_model.parameters(), strict=True))


def test_saving_a_stateless_optimizer_leaves_the_weights_alone():
    model = nn.Linear(4, 2)
    optimizer = PrecisionOptimizer(
        model.parameters(), resolve_policy("fp32"), lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.5)
    )
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.state_dict(["weight", "bias"])  # SGD without momentum keeps no state: nothing to create
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_loaded_groups_keep_their_own_scales():
    """A checkpoint's groups are one rank's: another pipeline stage, whose muP groups come in another order and number,
    keeps its own learning-rate and weight-decay scales when it loads them, and its rates follow from them."""
    from nxd_precision import apply_options, apply_schedule, build_optimizer, build_scheduler

    options = {"lr": 0.01, "weight_decay": 0.1}

    def stage(scales: list[tuple[float, float]]) -> tuple[PrecisionOptimizer, list[str]]:
        model = nn.Sequential(*(nn.Linear(4, 4, bias=False) for _ in scales))
        optimizer = PrecisionOptimizer(
            model.parameters(),
            resolve_policy("fp32"),
            lambda tensors: build_optimizer("adam", tensors, options, decay_norms_and_biases=False, scales=scales),
        )
        return optimizer, [f"{index}.weight" for index in range(len(scales))]

    first, first_names = stage([(1.0, 1.0), (0.25, 4.0)])
    second, second_names = stage([(0.25, 4.0), (0.5, 2.0), (1.0, 1.0)])
    state = first.state_dict(first_names)
    second.load_state_dict(state, second_names)
    scheduler = build_scheduler(second.optimizer, None, {}, 0.01, 10)
    apply_options(second.optimizer, "adam", options)
    apply_schedule(scheduler, 0.01)
    assert [(g["lr"], g["weight_decay"]) for g in second.param_groups] == [
        (0.01 * 0.25, 0.1 * 4.0),
        (0.01 * 0.5, 0.1 * 2.0),
        (0.01, 0.1),
    ]
