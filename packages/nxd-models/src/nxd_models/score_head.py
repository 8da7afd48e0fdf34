"""A reward model's output layer: one score per position in place of the logits over the vocabulary.

A reward model is a causal LM whose LM head is replaced by a linear layer to one output, without bias
(transformers' `*ForSequenceClassification` with `num_labels: 1`, whose `score` it exports as); the
decoder is unchanged. Both families keep the name `lm_head` for it, so pipeline cuts, tensor-parallel
plans and checkpoints find the output layer where they always do. Its per-position scores are what
the model's forward returns where a causal LM returns per-token cross-entropy: the reward objective
reads the score of each sequence's last token.
"""

from __future__ import annotations

import torch
from torch import nn

from .errors import ModelConfigError
from .hf_types import is_hf_model

HEADS = ("causal_lm", "score")
"""What a model's output layer computes: logits over the vocabulary, or one score per position."""


def check_head(head: str) -> str:
    """`head`, or a ModelConfigError when it is not one of `HEADS`."""
    if head not in HEADS:
        raise ModelConfigError(f"model head: expected one of {', '.join(HEADS)}, found {head!r}")
    return head


class ScoreHead(nn.Linear):
    """Linear(hidden, 1, bias=False); `scores(hidden)` is (batch, seq) in fp32."""

    def __init__(self, hidden_size: int):
        super().__init__(hidden_size, 1, bias=False)

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        scores = self(hidden).squeeze(-1)
        # a tensor of its own, not a view: a data-parallel wrapper hooks its backward on the model's output
        return scores.float() if scores.dtype != torch.float32 else scores.clone()


def use_score_head(model: nn.Module) -> nn.Module:
    """`model` (either family, on any device) with a score head in place of its LM head, untied from
    the embedding."""
    hidden = model.lm_head.weight.shape[1]
    device = model.lm_head.weight.device
    with torch.device(device):
        model.lm_head = ScoreHead(hidden)
    if is_hf_model(model):
        model.config.tie_word_embeddings = False
    return model
