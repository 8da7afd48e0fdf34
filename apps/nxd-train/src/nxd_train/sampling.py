"""Which samples each data-parallel rank reads at each step.

Step s of an epoch consumes global batch s of that epoch's order: `global_batch_size` consecutive
indices. Micro-batch m of rank r is the slice [(m * dp + r) * mbs, (m * dp + r + 1) * mbs), so the
union over ranks and micro-batches is the same global batch whatever the data-parallel size.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@functools.lru_cache(maxsize=2)
def _permutation(num_samples: int, seed: int) -> np.ndarray:
    """One epoch's order, computed once per epoch rather than once per step."""
    order = np.random.default_rng(seed).permutation(num_samples)
    order.flags.writeable = False
    return order


@dataclass(frozen=True)
class BatchPlan:
    num_samples: int
    global_batch_size: int
    micro_batch_size: int
    data_parallel_size: int
    data_parallel_rank: int
    seed: int
    shuffle: bool = True
    reshuffle_each_epoch: bool = False
    drop_last: bool = True

    @property
    def steps_per_epoch(self) -> int:
        full, partial = divmod(self.num_samples, self.global_batch_size)
        return full if self.drop_last or not partial else full + 1

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_samples)
        return _permutation(self.num_samples, self.seed + (epoch if self.reshuffle_each_epoch else 0))

    def micro_batches(self, epoch: int, step: int) -> list[list[int]]:
        """This rank's micro-batches (lists of sample indices) for `step` of `epoch`; the last global
        batch of an epoch without drop_last may leave some empty."""
        start = step * self.global_batch_size
        batch = self.order(epoch)[start : start + self.global_batch_size]
        mbs, dp = self.micro_batch_size, self.data_parallel_size
        accumulation = self.global_batch_size // (mbs * dp)
        return [
            batch[(m * dp + self.data_parallel_rank) * mbs : (m * dp + self.data_parallel_rank + 1) * mbs].tolist()
            for m in range(accumulation)
        ]


@dataclass(frozen=True)
class MicroBatchSampler:
    """A DataLoader batch sampler: this rank's non-empty micro-batches of `steps` consecutive steps
    from global step `start`, in order (so `data.num_workers` processes can prefetch them)."""

    plan: BatchPlan
    start: int
    steps: int

    def __iter__(self):
        for step in range(self.start, self.start + self.steps):
            epoch, index = divmod(step, self.plan.steps_per_epoch)
            yield from (indices for indices in self.plan.micro_batches(epoch, index) if indices)
