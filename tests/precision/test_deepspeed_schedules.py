"""DeepSpeed's schedules (the `scheduler` block of GPT-NeoX files) against DeepSpeed's formulas worked by hand: the
update of step s uses DeepSpeed's value at its iteration i = s - 1 (its constructor's value for s = 0)."""

from __future__ import annotations

import math

import pytest
import torch
from nxd_precision import apply_schedule, build_scheduler

LR = 0.02
"""The optimizer's rate (WarmupCosineLR's ratios scale it; the others set rates outright)."""


def rates(kind: str, params: dict, steps: int) -> tuple[list[float], list[float]]:
    """The rate and betas[0] each of `steps` updates uses."""
    optimizer = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=LR, betas=(0.9, 0.95))
    scheduler = build_scheduler(optimizer, "DeepSpeedSchedule", {"type": kind, **params}, LR, steps)
    lrs, moms = [], []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        moms.append(optimizer.param_groups[0]["betas"][0])
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["betas"][1] == 0.95  # the second coefficient stays the optimizer's
    return lrs, moms


def close(found: float, expected: float) -> bool:
    return math.isclose(found, expected, rel_tol=1e-12, abs_tol=1e-15)


def test_warmup_lr_log():
    lrs, _ = rates("WarmupLR", {"warmup_max_lr": 0.01, "warmup_num_steps": 10}, 13)
    assert lrs[0] == lrs[1] == 0.0  # the constructor's value, then iteration 0: log(1) = 0
    assert close(lrs[2], 0.01 * math.log(2) / math.log(10)) and close(lrs[11], 0.01) and close(lrs[12], 0.01)


def test_warmup_decay_lr_linear():
    lrs, _ = rates(
        "WarmupDecayLR",
        {"warmup_max_lr": 0.01, "warmup_num_steps": 10, "warmup_type": "linear", "total_num_steps": 20},
        27,
    )
    assert close(lrs[6], 0.005) and close(lrs[11], 0.01) and close(lrs[16], 0.005) and lrs[26] == 0.0


def test_warmup_cosine_lr():
    lrs, _ = rates(
        "WarmupCosineLR",
        {
            "warmup_num_steps": 10,
            "warmup_type": "linear",
            "total_num_steps": 20,
            "warmup_min_ratio": 0.1,
            "cos_min_ratio": 0.0,
        },
        12,
    )
    assert lrs[0] == 0.0 and close(lrs[6], LR * (0.1 + 0.5 * 0.9))
    assert close(lrs[11], LR * (1 + math.cos(math.pi / 10)) / 2)  # iteration 10: the cosine's first step


def test_one_cycle_cycles_the_rate_and_the_momentum():
    """A cycle of 20 (10 up, 10 down) at positions s / 20 for step s; after it, cycle_min_lr / (1 + 0.5 x
    (s - 20) / 5), the momentum back at cycle_max_mom (decay_mom_rate 0)."""
    lrs, moms = rates(
        "OneCycle",
        {
            "cycle_min_lr": 0.01,
            "cycle_max_lr": 0.1,
            "cycle_first_step_size": 10,
            "decay_step_size": 5,
            "decay_lr_rate": 0.5,
        },
        32,
    )
    assert (lrs[0], moms[0]) == (0.01, 0.8)  # the constructor sets the low rate and the low momentum
    for step, (lr, mom) in {
        5: (0.055, 0.85),
        10: (0.1, 0.8),
        15: (0.055, 0.85),
        20: (0.01, 0.9),
        21: (0.01 / 1.1, 0.9),
        31: (0.01 / 2.1, 0.9),
    }.items():
        assert close(lrs[step], lr) and close(moms[step], mom), step
    _, kept = rates("OneCycle", {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_momentum": False}, 3)
    assert kept == [0.9, 0.9, 0.9]


@pytest.mark.parametrize(("staircase", "expected"), [(False, 0.001 * (1 + 2 * 1.6)), (True, 0.001 * (1 + 2 * 1))])
def test_lr_range_test(staircase, expected):
    lrs, _ = rates(
        "LRRangeTest",
        {"lr_range_test_step_size": 10, "lr_range_test_step_rate": 2.0, "lr_range_test_staircase": staircase},
        17,
    )
    assert lrs[0] == 0.001 and close(lrs[16], expected)  # iteration 15 grows by (15 + 1) / 10 intervals


def test_a_resumed_one_cycle_sets_the_momentum_of_its_step():
    optimizer = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=LR)
    options = {"type": "OneCycle", "cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_first_step_size": 10}
    scheduler = build_scheduler(optimizer, "DeepSpeedSchedule", options, LR, 20)
    saved = scheduler.state_dict()
    assert "momentum" not in saved  # a checkpoint holds values only
    scheduler.load_state_dict({**saved, "last_epoch": 6})
    apply_schedule(scheduler, LR)
    assert close(optimizer.param_groups[0]["lr"], 0.064) and close(optimizer.param_groups[0]["betas"][0], 0.84)


def test_a_run_steps_with_the_schedule_and_resumes_it(tmp_path, train_here):
    """nxd-train logs the rate each update used (OneCycle over 2 + 2 steps: 0.01, then positions 1/4, 2/4, 3/4), and
    a run resumed from step 2's checkpoint continues with the same rates and losses."""
    job = [
        "trainer.max_steps=4",
        "~model.optim.sched",
        "+model.optim.sched={name: DeepSpeedSchedule, type: OneCycle, "
        "cycle_min_lr: 0.01, cycle_max_lr: 0.03, cycle_first_step_size: 2}",
        "exp_manager.create_checkpoint_callback=True",
        "+exp_manager.checkpoint_callback_params.save_top_k=-1",
        "+exp_manager.checkpoint_callback_params.every_n_train_steps=2",
    ]
    whole = [row for row in train_here(*job) if "loss" in row]
    assert all(close(row["lr"], lr) for row, lr in zip(whole, [0.01, 0.02, 0.03, 0.02], strict=True))
    (step_2,) = (tmp_path / "run0" / "checkpoints").glob("*step=2*")
    resumed = [row for row in train_here(*job, f"+exp_manager.resume_from_checkpoint={step_2}") if "loss" in row]
    assert [(row["lr"], row["loss"]) for row in resumed] == [(row["lr"], row["loss"]) for row in whole[2:]]


def test_one_cycle_stairs_are_noticed_as_doing_nothing():
    import warnings

    from nxd_config import ConfigNotice, load_config
    from nxd_train.cli import default_config_path

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config(
            default_config_path(),
            [
                "~model.optim.sched",
                "+model.optim.sched={name: DeepSpeedSchedule, "
                "type: OneCycle, cycle_min_lr: 0.01, cycle_max_lr: 0.1, "
                "cycle_first_stair_count: 4}",
            ],
        )
    assert any(
        "cycle_first_stair_count: accepted, changes nothing" in str(w.message)
        for w in caught
        if issubclass(w.category, ConfigNotice)
    )
