"""Advantages of sampled completions from their rewards, group by group (the completions of one prompt).

Rewards of several functions are weighted and summed per completion; a function's NaN (it returned None) is left
out of the sum, and a completion no function scored gets advantage 0 (TRL's sum_then_normalize). The baseline is
the group's mean (GRPO), the mean of the group's other completions (RLOO, GPT-NeoX's reinforce_leave_one_out), or
a running mean of the recent groups' means (GPT-NeoX's REINFORCE without leave-one-out: the last 100). The
centred rewards are divided by a standard deviation plus 1e-4: the group's (GRPO), the whole batch's (Dr. GRPO's
"batch"), or none ("none").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

BASELINES = ("group_mean", "leave_one_out", "running_mean")
SCALES = ("group", "batch", "none")
RUNNING_GROUPS = 100
"""GPT-NeoX's window of group means for the running baseline."""
EPSILON = 1e-4


def weighted_rewards(per_function: torch.Tensor, weights: Sequence[float]) -> torch.Tensor:
    """(completions, functions) rewards, NaN where a function gave none -> one reward each: the weighted sum of
    the rewards given, NaN where there were none."""
    weighted = per_function * torch.tensor(list(weights), dtype=per_function.dtype, device=per_function.device)
    total = weighted.nansum(dim=1)
    return torch.where(per_function.isnan().all(dim=1), torch.nan, total)


def nan_std(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The unbiased standard deviation of the values that are not NaN (NaN with fewer than two)."""
    present = ~values.isnan()
    count = present.sum() if dim is None else present.sum(dim)
    mean = values.nanmean() if dim is None else values.nanmean(dim, keepdim=True)
    squares = ((values - mean).square()).nansum() if dim is None else ((values - mean).square()).nansum(dim)
    return (squares / (count - 1)).sqrt()


@dataclass
class Advantages:
    """The advantage rule of a run; `running_mean` keeps its window across steps (part of the run's state)."""

    group_size: int
    baseline: str = "group_mean"
    scale: str = "group"
    history: deque[float] = field(default_factory=lambda: deque(maxlen=RUNNING_GROUPS))

    def __post_init__(self) -> None:
        if self.baseline not in BASELINES:
            raise ValueError(f"grpo baseline: expected one of {', '.join(BASELINES)}, found {self.baseline!r}")
        if self.scale not in SCALES:
            raise ValueError(f"grpo scale_rewards: expected one of {', '.join(SCALES)}, found {self.scale!r}")

    def __call__(
        self, rewards: torch.Tensor, batch_std: Callable[[torch.Tensor], torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Advantages of `rewards` (completions,), whose consecutive groups of `group_size` share a prompt.
        `batch_std` gives the standard deviation over the whole global batch (every rank's rewards) for scale
        "batch"; without it, this batch's."""
        groups = rewards.view(-1, self.group_size)
        if self.baseline == "group_mean":
            centred = groups - groups.nanmean(dim=1, keepdim=True)
        elif self.baseline == "leave_one_out":
            present = (~groups.isnan()).sum(dim=1, keepdim=True)
            others = (groups.nansum(dim=1, keepdim=True) - groups) / (present - 1).clamp(min=1)
            centred = groups - others
        else:  # each group against the groups before it, as GPT-NeoX reads them one by one
            baselines = []
            for mean in groups.nanmean(dim=1).tolist():
                baselines.append(sum(self.history) / len(self.history) if self.history else 0.0)
                if mean == mean:  # a group no function scored adds nothing
                    self.history.append(mean)
            centred = groups - torch.tensor(baselines, dtype=groups.dtype, device=groups.device).unsqueeze(1)
        if self.scale == "group":
            centred = centred / (nan_std(groups, dim=1).unsqueeze(1) + EPSILON)
        elif self.scale == "batch":
            std = nan_std(rewards) if batch_std is None else batch_std(rewards)
            centred = centred / (std + EPSILON)
        return centred.reshape(-1).nan_to_num(0.0)

    def state_dict(self) -> dict[str, list[float]]:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict[str, list[float]]) -> None:
        self.history.clear()
        self.history.extend(state.get("history", []))
