"""Every learning-rate schedule against its formula worked by hand (peak lr 1.0, values at several steps)."""

from __future__ import annotations

import math

import pytest
import torch
from nxd_precision import build_scheduler
from nxd_precision.schedules import SCHEDULE_NAMES

CASES = {
    "cosine": (
        {"name": "CosineAnnealing", "warmup_steps": 2, "min_lr": 0.1, "max_steps": 10},
        {0: 1 / 3, 1: 2 / 3, 2: 1.0, 3: 0.1 + 0.45 * (1 + math.cos(math.pi / 8)), 6: 0.55, 10: 0.1, 11: 0.1},
    ),
    "cosine-warmup-ratio": (
        {"name": "CosineAnnealing", "warmup_ratio": 0.2, "min_lr": 0.1, "max_steps": 10},
        {0: 1 / 3, 2: 1.0, 6: 0.55},
    ),
    "cosine-constant": (
        {"name": "CosineAnnealing", "warmup_steps": 2, "constant_steps": 2, "min_lr": 0.1, "max_steps": 10},
        {3: 0.1 + 0.45 * (1 + math.cos(math.pi / 6)), 5: 0.55, 8: 0.1, 9: 0.1, 10: 0.1},
    ),
    "linear": (
        {"name": "LinearAnnealingWithWarmUp", "warmup_steps": 4, "max_steps": 10},
        {0: 0.0, 2: 0.5, 4: 1.0, 7: 0.5, 10: 0.0, 12: 0.0},
    ),
    "warmup": (
        {"name": "WarmupPolicy", "warmup_steps": 3, "max_steps": 10},
        {0: 0.25, 3: 1.0, 5: 1.0, 10: 1.0, 11: 0.0},
    ),
    "warmup-hold": (
        {"name": "WarmupHoldPolicy", "warmup_steps": 2, "hold_steps": 3, "min_lr": 0.05, "max_steps": 10},
        {0: 1 / 3, 2: 1.0, 4: 1.0, 7: 1.0, 11: 0.05},
    ),
    "square": (
        {"name": "SquareAnnealing", "warmup_steps": 2, "max_steps": 10},
        {0: 1 / 3, 3: (7 / 8) ** 2, 6: 0.25, 10: 1e-5},
    ),
    "noam": (
        {"name": "NoamAnnealing", "d_model": 16, "warmup_steps": 4, "max_steps": 100},
        {0: 0.25 * 0.125, 1: 0.25 * 0.125, 4: 0.25 * 0.5, 16: 0.25 * 0.25},
    ),
    "noam-min-lr": (
        {"name": "NoamAnnealing", "d_model": 16, "warmup_steps": 4, "min_lr": 0.1, "max_steps": 100},
        {4: 0.125, 16: 0.1},
    ),
    "warmup-annealing": (
        {"name": "WarmupAnnealing", "warmup_steps": 2, "max_steps": 10},
        {0: 1 / 3, 2: 1.0, 4: 0.75, 10: 0.0},
    ),
    "step": ({"name": "StepLR", "step_size": 3, "gamma": 0.5}, {0: 1.0, 2: 1.0, 3: 0.5, 6: 0.25}),
    "exponential": ({"name": "ExponentialLR", "gamma": 0.9}, {0: 1.0, 1: 0.9, 3: 0.729}),
    # GPT-NeoX's AnnealingLR: warmup 0.2 x 10 = 2 steps (step 0 takes step 1's rate), then 8 steps of decay, min_lr a
    # floor, no clamp after the horizon
    "neox-linear": (
        {"name": "NeoXAnnealing", "decay_style": "linear", "warmup_ratio": 0.2, "min_lr": 0.1, "max_steps": 10},
        {0: 0.5, 1: 0.5, 2: 1.0, 3: 7 / 8, 6: 0.5, 10: 0.1, 14: 0.1},
    ),
    "neox-cosine": (
        {"name": "NeoXAnnealing", "decay_style": "cosine", "warmup_ratio": 0.2, "min_lr": 0.1, "max_steps": 10},
        {1: 0.5, 2: 1.0, 6: 0.55, 10: 0.1, 14: 0.55, 18: 1.0},
    ),
    "neox-exponential": (
        {"name": "NeoXAnnealing", "decay_style": "exponential", "warmup_ratio": 0.2, "max_steps": 10},
        {2: 1.0, 6: math.exp(-0.693 / 2), 10: math.exp(-0.693)},
    ),
    "neox-constant": (
        {"name": "NeoXAnnealing", "decay_style": "constant", "warmup_ratio": 0.25, "max_steps": 10},
        {0: 0.4, 2: 0.8, 3: 1.0, 9: 1.0},
    ),
    "neox-no-warmup": (
        {"name": "NeoXAnnealing", "decay_style": "linear", "warmup_ratio": 0.0, "max_steps": 4},
        {0: 1.0, 1: 0.75, 4: 0.0},
    ),
    # transformers' schedules: cosine warmup 2 of 10 steps, then (1 + cos(pi (s - 2) / 8)) / 2; linear with
    # warmup_ratio 0.25 of 8 steps (2 steps), then (8 - s) / 6
    "transformers-cosine": (
        {"name": "TransformersSchedule", "type": "cosine", "warmup_steps": 2, "max_steps": 10},
        {0: 0.0, 1: 0.5, 2: 1.0, 6: 0.5, 10: 0.0},
    ),
    "transformers-linear": (
        {"name": "TransformersSchedule", "type": "linear", "warmup_ratio": 0.25, "max_steps": 8},
        {1: 0.5, 2: 1.0, 5: 0.5, 8: 0.0},
    ),
    # DeepSpeed's WarmupDecayLR (the rest in test_deepspeed_schedules): step s at iteration s - 1, linear warmup
    # over 4, then (8 - i) / 4
    "deepspeed-warmup-decay": (
        {
            "name": "DeepSpeedSchedule",
            "type": "WarmupDecayLR",
            "warmup_max_lr": 1.0,
            "warmup_num_steps": 4,
            "warmup_type": "linear",
            "total_num_steps": 8,
        },
        {0: 0.0, 1: 0.0, 3: 0.5, 5: 1.0, 7: 0.5, 9: 0.0},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_schedule_matches_its_formula(case):
    config, expected = CASES[case]
    name, options = config["name"], {k: v for k, v in config.items() if k != "name"}
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_scheduler(optimizer, name, options, 1.0, run_steps=1000)
    seen = {}
    for step in range(max(expected) + 1):
        seen[step] = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
    for step, lr in expected.items():
        assert seen[step] == pytest.approx(lr, abs=1e-12), (case, step)


def test_every_scheduler_name_has_a_case():
    assert {config["name"] for config, _ in CASES.values()} == set(SCHEDULE_NAMES)


def test_max_steps_defaults_to_the_run_length():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    scheduler = build_scheduler(optimizer, "WarmupAnnealing", {"warmup_steps": 0, "max_steps": None}, 2.0, run_steps=4)
    for _ in range(2):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1.0)  # halfway through 4 steps


def test_no_schedule_keeps_lr_constant():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.3)
    scheduler = build_scheduler(optimizer, None, {}, 0.3, run_steps=4)
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.3
