"""What a GRPO step's rollouts are logged as (TRL's names where TRL has one), from the sums of every
data-parallel rank."""

from __future__ import annotations

import math
from collections.abc import Sequence

from nxd_align.rewards import Reward


def mean_std(total: float, squares: float, count: float) -> tuple[float, float]:
    """The mean and unbiased standard deviation of `count` values from their sum and sum of squares."""
    if count < 1:
        return math.nan, math.nan
    mean = total / count
    return mean, math.sqrt(max(squares - total * mean, 0.0) / (count - 1)) if count > 1 else 0.0


def rollout_metrics(
    share: dict[str, float], extremes: list[float], rewards: Sequence[Reward], dp: int
) -> dict[str, float]:
    """The logged rollout values from the sums over the data-parallel ranks."""
    completions = share["completions"]
    reward, reward_std = mean_std(share["reward"], share["reward_squares"], share["scored"])
    values = {
        "reward": reward,
        "reward_std": reward_std,
        "advantages/std": math.sqrt(share["advantage_squares"] / completions) if completions else math.nan,
        "frac_reward_zero_std": share["zero_std"] / share["groups"] if share["groups"] else math.nan,
        "completions/mean_length": share["length"] / completions if completions else math.nan,
        "completions/min_length": extremes[0],
        "completions/max_length": -extremes[1],
        "completions/clipped_ratio": share["truncated"] / completions if completions else math.nan,
        "entropy": share["entropy"] / share["entropy_tokens"] if share["entropy_tokens"] else math.nan,
        "rollouts/tokens_per_s": share["length"] / (share["generation_seconds"] / dp)
        if share["generation_seconds"]
        else math.nan,
        "rollouts/generation_seconds": share["generation_seconds"] / dp,
        "rollouts/seconds": share["step_rollout_seconds"] / dp,
        "rollouts/skipped_groups": share["skipped_groups"],
        "rollouts/refilled_groups": share["refilled_groups"],
    }
    for reward_spec in rewards:
        name = reward_spec.name
        mean, std = mean_std(
            share[f"rewards/{name}/sum"], share[f"rewards/{name}/squares"], share[f"rewards/{name}/count"]
        )
        values[f"rewards/{name}/mean"], values[f"rewards/{name}/std"] = mean, std
    return values


ROLLOUT_PREFIXES = ("reward", "advantages/", "frac_reward_zero_std", "completions/", "entropy", "rollouts/")
"""What the rollout metrics are logged as (TRL's names where TRL has one)."""
