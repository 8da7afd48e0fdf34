"""Per-token losses of a micro-batch through either family: what every objective is computed from."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from .hf_pipeline import stage_forward
from .hf_types import is_hf_model


def causal_lm_token_losses(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Per-token cross-entropy (batch, seq) in fp32 of a micro-batch (`input_ids`, `labels`,
    `position_ids`, optionally `document_ids`), 0 where the label is ignored, through either family.

    Both compute it from the final hidden states and the output layer on the positions whose label
    counts, in chunks of the family's `loss_chunk_tokens` when that is set (so whole logits never
    exist); a transformers model runs the stage forward for it (its own forward would return the whole
    logits first). A reward model's score head gives per-position scores."""
    inputs = (batch["input_ids"], batch["position_ids"], batch.get("document_ids"))
    inner = getattr(model, "module", model)
    if is_hf_model(inner):
        with stage_forward(inner):
            return model(*inputs, labels=batch["labels"])
    return model(*inputs, labels=batch["labels"])
