"""Which samples each data-parallel rank reads, driven by the number of samples consumed so far.

The global sample stream is epoch after epoch of the dataset's order (identity, or a permutation
seeded by `seed` — and `seed + epoch` when reshuffling each epoch). Each optimizer step takes the
next `global_batch_size` samples of the stream; micro-batch m of rank r is the slice
[(m * dp + r) * mbs, (m * dp + r + 1) * mbs) of that global batch, so the set of samples in a step
does not depend on the data-parallel size. The only state is `consumed_samples`, so a run resumed
from a checkpoint at consumed_samples = k, at any data-parallel size, reads exactly the batches an
uninterrupted run would have read next. Map-style datasets and workers hold no other position.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

PADDING = -1
"""Index of a padding sample: it fills a batch and adds nothing to the loss."""


@functools.lru_cache(maxsize=4)
def _permutation(num_samples: int, seed: int) -> np.ndarray:
    order = np.random.default_rng(seed).permutation(num_samples)
    order.flags.writeable = False
    return order


@functools.lru_cache(maxsize=4)
def _grouped_permutation(num_samples: int, seed: int, megabatch: int, lengths: bytes) -> np.ndarray:
    """transformers' length grouping: the seeded permutation cut into megabatches, each sorted longest first."""
    order = _permutation(num_samples, seed)
    sizes = np.frombuffer(lengths, dtype=np.int64)
    parts = [
        part[np.argsort(-sizes[part], kind="stable")]
        for part in np.split(order, range(megabatch, len(order), megabatch))
    ]
    grouped = np.concatenate(parts) if parts else order
    grouped.flags.writeable = False
    return grouped


@dataclass(frozen=True)
class PretrainingSampler:
    """A DataLoader batch sampler yielding this rank's micro-batches from `consumed_samples` on, for
    `steps` optimizer steps (None: every remaining step of the current pass when drop_last is False,
    otherwise without end)."""

    total_samples: int
    global_batch_size: int
    micro_batch_size: int
    data_parallel_size: int = 1
    data_parallel_rank: int = 0
    consumed_samples: int = 0
    shuffle: bool = False
    reshuffle_each_epoch: bool = False
    seed: int = 0
    drop_last: bool = True
    pad_to_global_batch: bool = False
    steps: int | None = None
    lengths: bytes | None = None
    """Each sample's length (int64 bytes): a shuffled order is grouped by length as transformers'
    group_by_length groups it (megabatches of up to 50 global batches, each sorted longest first), so a
    micro-batch's samples are of like length and little of it is padding."""

    def __post_init__(self) -> None:
        per_step = self.micro_batch_size * self.data_parallel_size
        if self.global_batch_size % per_step:
            raise ValueError(
                f"global batch {self.global_batch_size} is not a multiple of micro batch "
                f"{self.micro_batch_size} x data-parallel size {self.data_parallel_size}"
            )
        if not 0 <= self.data_parallel_rank < self.data_parallel_size:
            raise ValueError(f"data-parallel rank {self.data_parallel_rank} of {self.data_parallel_size}")

    @property
    def accumulation(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.data_parallel_size)

    @property
    def epoch_samples(self) -> int:
        """Samples of the stream per epoch (whole global batches only when drop_last)."""
        if self.drop_last:
            return self.total_samples - self.total_samples % self.global_batch_size
        return self.total_samples

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.epoch_samples // self.global_batch_size)

    def order(self, epoch: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Positions `start` to `stop` of epoch `epoch`'s sample order."""
        stop = self.total_samples if stop is None else stop
        if not self.shuffle:
            return np.arange(start, stop)  # no whole-epoch array per batch
        seed = self.seed + (epoch if self.reshuffle_each_epoch else 0)
        if self.lengths is not None:
            megabatch = self.global_batch_size * max(1, min(self.total_samples // (self.global_batch_size * 4), 50))
            return _grouped_permutation(self.total_samples, seed, megabatch, self.lengths)[start:stop]
        return _permutation(self.total_samples, seed)[start:stop]

    def global_batch(self, consumed: int) -> list[int]:
        """The global batch starting at stream position `consumed` (shorter at the end of a pass
        without drop_last)."""
        if self.epoch_samples == 0:
            raise ValueError(f"{self.total_samples} samples hold no global batch of {self.global_batch_size}")
        batch: list[int] = []
        while len(batch) < self.global_batch_size:
            epoch, offset = divmod(consumed, self.epoch_samples)
            take = self.order(epoch, offset, min(self.epoch_samples, offset + self.global_batch_size - len(batch)))
            batch += take.tolist()
            consumed += len(take)
            if not self.drop_last and consumed % self.epoch_samples == 0:
                break  # the last, partial batch of a pass
        return batch

    def micro_batches(self, batch: list[int]) -> list[list[int]]:
        """This rank's micro-batches of one global batch. A short batch still gives every rank the
        same number of non-empty micro-batches (so collective operations stay matched): padded to
        full size with `pad_to_global_batch`, otherwise holes filled by one padding sample."""
        if self.pad_to_global_batch:
            batch = batch + [PADDING] * (self.global_batch_size - len(batch))
        mbs, dp, rank = self.micro_batch_size, self.data_parallel_size, self.data_parallel_rank
        slices = [batch[(m * dp + rank) * mbs : (m * dp + rank + 1) * mbs] for m in range(self.accumulation)]
        if len(batch) < self.global_batch_size:
            used = -(-len(batch) // (mbs * dp))  # micro-batch rounds that hold any real sample
            slices = [indices or [PADDING] for indices in slices[:used]]
        return slices

    def __iter__(self) -> Iterator[list[int]]:
        consumed, step = self.consumed_samples, 0
        end = None if self.drop_last else self.epoch_samples * (self.consumed_samples // self.epoch_samples + 1)
        while (self.steps is None or step < self.steps) and (end is None or consumed < end):
            batch = self.global_batch(consumed)
            yield from self.micro_batches(batch)
            consumed += len(batch)
            step += 1

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the stream position and what defines the stream."""
        names = ("consumed_samples", "total_samples", "shuffle", "reshuffle_each_epoch", "seed")
        grouped = {"group_by_length": True} if self.lengths is not None else {}  # checkpoints before it hold none
        return {name: getattr(self, name) for name in names} | grouped

    def resumed(self, state: dict[str, Any], *, steps: int | None = None) -> PretrainingSampler:
        """This sampler continued from a saved state (any data-parallel size); a state saved from another
        sample stream is refused rather than read as a different order. Another `total_samples` is the
        same stream when the order is not shuffled and both runs' positions so far lie in the first pass
        (a longer run over a dataset whose sample k does not depend on its length, such as Megatron's)."""
        ours = self.state_dict()
        for name in ("shuffle", "reshuffle_each_epoch", "seed", "group_by_length"):
            if state.get(name, False) != ours.get(name, False):
                raise ValueError(
                    f"the saved data position was taken on another sample stream: {name} was "
                    f"{state.get(name, False)!r}, this run has {ours.get(name, False)!r}"
                )
        consumed, saved_total = int(state["consumed_samples"]), int(state["total_samples"])
        if saved_total != self.total_samples and not self._extends(saved_total, consumed):
            why = (
                "its shuffled order is drawn over all of them"
                if self.shuffle
                else "its position lies beyond the first pass of the shorter stream"
            )
            raise ValueError(
                f"the saved data position was taken on another sample stream: total_samples was "
                f"{saved_total!r}, this run has {self.total_samples!r}, and {why}"
            )
        return replace(self, consumed_samples=consumed, steps=steps)

    def _extends(self, saved_total: int, consumed: int) -> bool:
        """Whether a stream of `saved_total` samples, read to `consumed`, agrees with this one on every
        position read so far and from there on to the end of this stream's first pass."""
        saved = replace(self, total_samples=saved_total)
        return not self.shuffle and consumed <= min(saved.epoch_samples, self.epoch_samples)


class WithPadding(Dataset):
    """`dataset` whose index PADDING gives `padding` (a sample that adds nothing to the loss)."""

    def __init__(self, dataset: Dataset, padding: dict[str, torch.Tensor]):
        self.dataset, self.padding = dataset, padding

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.padding if index == PADDING else self.dataset[index]
