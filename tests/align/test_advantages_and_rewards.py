"""Advantages from rewards by hand (GRPO's group z-score, RLOO's leave-one-out, GPT-NeoX's running mean, Dr. GRPO's
unscaled and batch-scaled rewards) and the built-in verifiable rewards, with what a bad reward function gets."""

from __future__ import annotations

import math

import pytest
import torch
from nxd_align import Advantages, weighted_rewards
from nxd_align.rewards import Reward, RewardError, builtin_reward, checked, numeric_answer

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0], dtype=torch.float64)  # two groups of 4


def test_group_normalised_advantages_by_hand():
    # group 1: mean 0.5, unbiased std sqrt(1/3); group 2: all equal, so 0 / (0 + 1e-4) = 0
    found = Advantages(4)(REWARDS.clone())
    std = math.sqrt(((0.5**2) * 4) / 3)
    assert found[:4].tolist() == pytest.approx(
        [0.5 / (std + 1e-4), -0.5 / (std + 1e-4)] * 1 + [-0.5 / (std + 1e-4), 0.5 / (std + 1e-4)]
    )
    assert found[4:].tolist() == [0.0] * 4


def test_leave_one_out_and_running_mean_by_hand():
    loo = Advantages(4, baseline="leave_one_out", scale="none")(REWARDS.clone())
    assert loo[:4].tolist() == pytest.approx([1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3])
    running = Advantages(4, baseline="running_mean", scale="none")
    first = running(REWARDS.clone())  # group 1 against nothing yet (0), group 2 against group 1's mean 0.5
    assert first.tolist() == pytest.approx([1, 0, 0, 1, 1.5, 1.5, 1.5, 1.5])
    second = running(torch.zeros(4, dtype=torch.float64))  # against the mean of 0.5 and 2.0
    assert second.tolist() == pytest.approx([-1.25] * 4)


def test_batch_scale_divides_by_the_whole_batchs_std():
    found = Advantages(4, scale="batch")(REWARDS.clone())
    centred = torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0], dtype=torch.float64)
    assert found.tolist() == pytest.approx((centred / (REWARDS.std() + 1e-4)).tolist())


def test_weighted_rewards_leave_out_what_a_function_did_not_score():
    per_function = torch.tensor([[1.0, 0.5], [math.nan, 1.0], [math.nan, math.nan]], dtype=torch.float64)
    found = weighted_rewards(per_function, [1.0, 0.25])
    assert found[:2].tolist() == [1.125, 0.25] and math.isnan(found[2])


def test_builtin_rewards():
    assert numeric_answer("so 3 + 4 = 7\n#### 1,234.5") == 1234.5 and numeric_answer("it is 42.") == 42.0
    numeric = builtin_reward("numeric", tolerance=0.01)
    assert numeric(["#### 7", "7.001", "8", "none"], answer=["7", "7", "7", "7"]) == [1.0, 1.0, 0.0, 0.0]
    exact = builtin_reward("exact_match", field="label")
    chat = [[{"role": "assistant", "content": " yes "}], [{"role": "assistant", "content": "no"}]]
    assert exact(chat, label=["yes", "yes"]) == [1.0, 0.0]
    assert builtin_reward("regex", pattern=r"\d")(["a1", "ab"]) == [1.0, 0.0]
    assert builtin_reward("format", pattern=r"<answer>\d+</answer>")(
        ["<answer>3</answer>", "x <answer>3</answer>"]
    ) == [
        1.0,
        0.0,
    ]


@pytest.mark.parametrize(
    "returned, message",
    [
        (lambda completions, **_: [1.0], "expected 2 scores (one a completion), found 1 (a.jsonl line 1)"),
        (
            lambda completions, **_: [1.0, math.nan],
            "expected a number or None for each completion, found nan (a.jsonl line 2)",
        ),
        (lambda completions, **_: 1 / 0, "raised ZeroDivisionError: division by zero (a.jsonl line 1)"),
    ],
)
def test_a_bad_reward_is_named_with_the_record(returned, message):
    with pytest.raises(RewardError, match=f"reward judge: {message}".replace("(", r"\(").replace(")", r"\)")):
        checked(Reward("judge", returned), 2, lambda f: f(completions=["a", "b"]), ["a.jsonl line 1", "a.jsonl line 2"])
    assert (
        checked(
            Reward("judge", lambda completions, **_: [None, 2]), 2, lambda f: f(completions=["a", "b"]), ["x", "y"]
        )[1]
        == 2.0
    )
