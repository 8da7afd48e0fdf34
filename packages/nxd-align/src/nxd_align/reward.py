"""Reward models (the Bradley-Terry pairwise loss of InstructGPT, as TRL's RewardTrainer and GPT-NeoX's
`train_impl: rm` train them): a causal LM whose output layer is a score head (nxd-models' `ScoreHead`)
scores a chosen and a rejected response to the same prompt, each at its sequence's last token.

Per pair, with scores r_c and r_r: -log sigmoid(r_c - r_r - m) + z (r_c^2 + r_r^2), m the record's
margin (0 without one; TRL's), z the `z_loss` coefficient (GPT-NeoX's: it keeps scores near 0).
Batches are pairs as nxd-data's `collate_pairs` makes them, with `score_position` per row (the
position of the last token that is not padding, where transformers' sequence classifiers read the
score too) and `margin` per row (the pair's, on both rows). The model's per-position output stands
where a causal LM's per-token cross-entropy would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .objectives import Batch
from .preference import PreferenceTerms, WholeSequences

SCORE_POSITION_KEY = "score_position"
MARGIN_KEY = "margin"
REWARD_METRICS = ("accuracy", "margin", "rewards/chosen", "rewards/rejected")
"""What a reward model logs per pair, under TRL's names: chosen scored above rejected, the mean
difference of the scores, and the mean score of each."""


def reward_loss(chosen: torch.Tensor, rejected: torch.Tensor, z_loss: float = 0.0,
                margin: torch.Tensor | None = None) -> PreferenceTerms:  # fmt: skip
    """The pairwise loss per pair (see the module docstring) in fp64; the 'rewards' are the scores."""
    chosen, rejected = chosen.double(), rejected.double()
    difference = chosen - rejected - (0.0 if margin is None else margin.double())
    loss = -F.logsigmoid(difference) + z_loss * (chosen**2 + rejected**2)
    return PreferenceTerms(loss, chosen.detach(), rejected.detach())


def sequence_scores(token_scores: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Each row's score: the model's output at the row's `score_position` (compared with the global
    `position_ids`, so a part of the sequence holds it or adds 0)."""
    at = batch["position_ids"] == batch[SCORE_POSITION_KEY].unsqueeze(-1)
    return (token_scores.float() * at).sum(-1)


@dataclass(frozen=True)
class RewardObjective(WholeSequences):
    """The reward model's loss averaged over the pairs of the global batch."""

    z_loss: float = 0.0
    name: str = "reward_model"
    metric_names: tuple[str, ...] = REWARD_METRICS

    def count(self, batch: Batch) -> torch.Tensor:
        return self._valid_pairs(batch["labels"]).sum() / self._parts

    def loss(self, token_losses: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        scores = self._whole(sequence_scores(token_losses, batch))
        margin = batch.get(MARGIN_KEY)
        terms = reward_loss(scores[0::2], scores[1::2], self.z_loss, None if margin is None else margin[0::2])
        valid = self._valid_pairs(batch["labels"])
        values = {"accuracy": terms.accuracies, "margin": terms.margins, "rewards/chosen": terms.chosen_rewards,
                  "rewards/rejected": terms.rejected_rewards}  # fmt: skip
        metrics = {name: (value.double() * valid).sum() / self._parts for name, value in values.items()}
        return (terms.loss * valid).sum() / self._parts, metrics
