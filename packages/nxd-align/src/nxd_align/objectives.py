"""Objectives: what one micro-batch contributes to a step's loss.

An objective turns a micro-batch's per-token cross-entropy (nxd-models' `ModelFamily.token_losses`,
from which every objective here is computed) into a loss *sum* and metric sums, and counts the items its
loss is normalised by (`count`). The loop divides by the global count over every micro-batch of every
data-parallel (and context-parallel) rank, so gradient accumulation and any layout give the gradient
of one big batch. Pretraining and supervised fine-tuning share the token objective: the data decides
which labels count (SFT ignores the prompt and the padding); DPO and ORPO are objectives of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from nxd_models import IGNORE_INDEX
from torch.distributed import ProcessGroup

Batch = dict[str, torch.Tensor]


class Objective(Protocol):
    """What the training loop asks of a fine-tuning or pretraining method."""

    name: str
    metric_names: tuple[str, ...]
    """The metrics `loss` sums; each is logged divided by the global count, like the loss."""

    def count(self, batch: Batch) -> torch.Tensor:
        """How many items of `batch` the loss is averaged over (a device tensor, no host sync)."""

    def loss(self, token_losses: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The fp64 loss sum of `batch` and its metric sums, from its per-token cross-entropy (batch, seq),
        0 where a label is ignored."""

    def split_over(self, group: ProcessGroup | None) -> Objective:
        """This objective on batches whose sequences are split over `group` (context parallelism)."""

    def report(self, values: dict[str, float]) -> dict[str, float]:
        """The logged values from the step's global means (the loss and each metric sum divided by the
        global count): where a metric is a mean over part of the batch, its own share divides it."""


@dataclass(frozen=True)
class TokenObjective:
    """Causal language modelling: the mean cross-entropy of every label that is not ignored.

    Pretraining counts every token (but padding, and end-of-document tokens with eod_mask_loss);
    SFT data ignores the prompt, so the same mean runs over the response tokens of the global batch."""

    name: str = "pretraining"
    metric_names: tuple[str, ...] = ()

    def count(self, batch: Batch) -> torch.Tensor:
        return (batch["labels"] != IGNORE_INDEX).sum()

    def loss(self, token_losses: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return token_losses.double().sum(), {}

    def split_over(self, group: ProcessGroup | None) -> TokenObjective:
        """Unchanged: token sums and counts add up over the parts of a sequence."""
        return self

    def report(self, values: dict[str, float]) -> dict[str, float]:
        return values
