"""Sequence-length curriculum (DeepSpeed's legacy curriculum_learning, curriculum_type seqlen, as GPT-NeoX uses it):
the first steps train on the first tokens of each sample only, the length growing to the whole sample.

DeepSpeed's schedules, for optimizer step s counted from 1 (DeepSpeed updates the difficulty with global_steps + 1):

- fixed_linear: floor(s / total_step x (max - min) + min), rounded down to a multiple of difficulty_step;
- fixed_root: the same with (s / total_step) ** (1 / root_degree);
- fixed_discrete: difficulty[i] for the steps up to max_step[i], the last difficulty after them;

never above max_difficulty, and once there it stays. The length is a function of the step alone, so a resumed run
trains on what the uninterrupted one did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

Schedule = Literal["fixed_linear", "fixed_root", "fixed_discrete"]


@dataclass(frozen=True)
class SequenceCurriculum:
    min_length: int
    max_length: int
    schedule: Schedule = "fixed_linear"
    total_steps: int = 1
    """Steps from min_length to max_length (fixed_linear, fixed_root)."""
    length_step: int = 8
    """Lengths are multiples of it (DeepSpeed's difficulty_step)."""
    root_degree: int = 1
    lengths: tuple[int, ...] = ()
    """fixed_discrete: the lengths in order (the first is min_length)."""
    max_steps: tuple[int, ...] = ()
    """fixed_discrete: the last step of each length but the last, increasing."""

    def length(self, step: int) -> int:
        """The sequence length optimizer step `step` (counted from 1) trains on."""
        if self.schedule == "fixed_discrete":
            level = next((at for at, last in enumerate(self.max_steps) if step <= last), len(self.max_steps))
            reached = [length for length in self.lengths[:level] if length >= self.max_length]
            return reached[0] if reached else self.lengths[level]  # the longest, once reached, stays
        degree = 1 if self.schedule == "fixed_linear" else self.root_degree
        grown = math.floor(
            (step / self.total_steps) ** (1.0 / degree) * (self.max_length - self.min_length) + self.min_length
        )
        return min(grown - grown % self.length_step, self.max_length)


def truncate(batch: dict[str, torch.Tensor], length: int) -> dict[str, torch.Tensor]:
    """`batch` with every per-token entry (two or more dimensions) cut to its first `length` tokens; per-row
    entries stay."""
    return {key: value[:, :length] if value.dim() > 1 else value for key, value in batch.items()}
