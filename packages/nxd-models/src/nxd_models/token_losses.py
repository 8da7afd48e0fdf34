"""Per-token cross-entropy of a causal LM: what every training objective is computed from.

The output layer turns each token's hidden state into vocabulary logits, the largest activation of a
model with a big vocabulary (a micro-batch of 2 x 2048 tokens over 128k tokens is 2.1 GB of fp32
logits, then as much again for their gradient). `chunked_token_cross_entropy` computes the same
per-token values a chunk of tokens at a time, each chunk under activation checkpointing: only one
chunk's logits exist at once, in the forward and in the backward (which recomputes them), at the
cost of running the output layer's forward twice.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .distributed_types import is_dtensor

IGNORE_INDEX = -100
"""Label of positions that do not count in the loss (transformers' and torch's convention)."""


def token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Per-token cross-entropy (0 where the label is ignored) of logits (..., vocab) in fp32 (fp64 logits
    stay fp64), shaped like `labels`.

    Logits that are a DTensor sharded on the vocabulary (tensor parallel output layer) are reduced with
    DTensor's vocab-parallel log-softmax: each rank holds vocab / tp columns, and only per-token
    maxima and sums cross ranks. Call it, and run the backward, inside
    `torch.distributed.tensor.parallel.loss_parallel()` (a no-op for plain tensors). The result is a
    plain tensor either way.
    """
    logits = logits if logits.dtype == torch.float64 else logits.float()
    losses = F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=ignore_index, reduction="none")
    losses = losses.full_tensor() if is_dtensor(losses) else losses
    return losses.view(labels.shape)


LOSS_TEMPERATURE = "nxd_loss_temperature"
"""The attribute of a model with an output layer that divides its logits before the per-token losses."""


def set_loss_temperature(model: nn.Module | Iterable[nn.Module], temperature: float) -> None:
    """Take every per-token loss of `model` (or of each of its pipeline stages) from its logits divided by
    `temperature`: the log-probs of the distribution online RL samples from (as TRL's GRPOTrainer takes them)."""
    for module in [model] if isinstance(model, nn.Module) else model:
        for inner in module.modules():
            if isinstance(getattr(inner, "lm_head", None), nn.Module):
                setattr(inner, LOSS_TEMPERATURE, float(temperature))


def chunked_token_cross_entropy(
    hidden: torch.Tensor, head: nn.Module, labels: torch.Tensor, chunk_tokens: int, temperature: float = 1.0
) -> torch.Tensor:
    """`token_cross_entropy(head(hidden), labels)`, computed for the counted labels only, `chunk_tokens`
    of them at a time (0: all at once).

    Positions whose label is ignored (a prompt, padding) never reach the output layer: their losses
    are 0 without logits, so fine-tuning data pays the output layer only for its responses. `head` is
    called as a module on the counted positions' hidden states, so the hooks tensor parallelism puts
    on it apply; a sharded `hidden` (a DTensor) is gathered first. With `chunk_tokens`, each chunk runs
    under activation checkpointing: only one chunk's logits exist at once, in the forward and in the
    backward (which recomputes them). Values equal the whole computation's up to the matmul's
    summation order. A `temperature` other than 1 divides the logits first."""
    mesh = hidden.device_mesh if is_dtensor(hidden) else None
    if mesh is not None:
        from torch.distributed.tensor import DTensor, Replicate

        hidden = hidden.redistribute(placements=[Replicate()] * mesh.ndim).to_local()
    counted = (labels != IGNORE_INDEX).flatten()
    flat_hidden, flat_labels = hidden.flatten(0, -2)[counted], labels.flatten()[counted]

    def chunk_losses(part: torch.Tensor, part_labels: torch.Tensor) -> torch.Tensor:
        if mesh is not None:
            part = DTensor.from_local(part, mesh, [Replicate()] * mesh.ndim, run_check=False)
        logits = head(part)
        return token_cross_entropy(logits if temperature == 1 else logits / temperature, part_labels)

    if chunk_tokens <= 0 or len(flat_labels) <= chunk_tokens:
        losses = chunk_losses(flat_hidden, flat_labels)
    else:
        losses = torch.cat(
            [
                checkpoint(chunk_losses, part, part_labels, use_reentrant=False, preserve_rng_state=False)
                for part, part_labels in zip(
                    flat_hidden.split(chunk_tokens), flat_labels.split(chunk_tokens), strict=True
                )
            ]
        )
    # a tensor of its own, not a view: a data-parallel wrapper hooks its backward on the model's output
    return losses.new_zeros(labels.shape).masked_scatter(counted.view(labels.shape), losses)
