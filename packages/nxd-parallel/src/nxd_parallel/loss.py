"""Cross-entropy over vocabulary-sharded logits, without gathering the full vocabulary
(`torch.distributed.tensor.parallel.loss_parallel`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor


def token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Per-token cross-entropy (0 where the label is ignored) of logits (..., vocab) in fp32.

    Logits that are a DTensor sharded on the vocabulary (the `colwise_output` style) are reduced with
    DTensor's vocab-parallel log-softmax: each rank holds vocab / tp columns, and only per-token
    maxima and sums cross ranks. Call it, and run the backward, inside `loss_parallel()` (a no-op for
    plain tensors). The result is a plain tensor either way.
    """
    losses = F.cross_entropy(logits.float().flatten(0, -2), labels.flatten(), ignore_index=ignore_index,
                             reduction="none")  # fmt: skip
    return losses.full_tensor() if isinstance(losses, DTensor) else losses
