"""The sequence-length curriculum against DeepSpeed's schedules worked by hand (floor(s / T x (max - min) + min),
rounded down to a multiple of difficulty_step, at most max; fixed_discrete by max_step)."""

from __future__ import annotations

import torch
from nxd_data import SequenceCurriculum, truncate


def lengths(curriculum: SequenceCurriculum, steps: int) -> list[int]:
    return [curriculum.length(step) for step in range(1, steps + 1)]


def test_fixed_linear():
    # s / 10 x 56 + 8: 13.6, 19.2, 24.8, 30.4, 36, 41.6, 47.2, 52.8, 58.4, 64, 69.6 -> multiples of 8, at most 64
    curriculum = SequenceCurriculum(8, 64, "fixed_linear", total_steps=10, length_step=8)
    assert lengths(curriculum, 11) == [8, 16, 24, 24, 32, 40, 40, 48, 56, 64, 64]


def test_fixed_root():
    # sqrt(s / 16) x 56 + 8 at s = 1, 4, 9, 16: 22, 36, 50, 64
    curriculum = SequenceCurriculum(8, 64, "fixed_root", total_steps=16, length_step=8, root_degree=2)
    assert [curriculum.length(step) for step in (1, 4, 9, 16, 17)] == [16, 32, 48, 64, 64]


def test_fixed_discrete():
    curriculum = SequenceCurriculum(8, 64, "fixed_discrete", lengths=(8, 16, 64), max_steps=(2, 4))
    assert lengths(curriculum, 6) == [8, 8, 16, 16, 64, 64]
    falling = SequenceCurriculum(8, 32, "fixed_discrete", lengths=(8, 32, 16), max_steps=(1, 2))
    assert lengths(falling, 4) == [8, 32, 32, 32]  # DeepSpeed stops updating once the longest is reached


def test_truncate_cuts_per_token_entries_only():
    batch = {
        "tokens": torch.arange(12).reshape(2, 6),
        "labels": torch.arange(12).reshape(2, 6) + 1,
        "weight": torch.ones(2),
    }
    cut = truncate(batch, 4)
    assert cut["tokens"].tolist() == [[0, 1, 2, 3], [6, 7, 8, 9]] and cut["labels"].tolist() == [
        [1, 2, 3, 4],
        [7, 8, 9, 10],
    ]
    assert cut["weight"] is batch["weight"]
