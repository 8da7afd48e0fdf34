"""Reward models (the Bradley-Terry pairwise loss of InstructGPT, as TRL's RewardTrainer and GPT-NeoX's
`train_impl: rm` train them): a causal LM whose output layer is a score head (nxd-models' `ScoreHead`)
scores a chosen and a rejected response to the same prompt, each at its sequence's last token.

Per pair, with scores r_c and r_r: -log sigmoid(r_c - r_r - m) + z (r_c^2 + r_r^2), m the record's
margin (0 without one; TRL's), z the `z_loss` coefficient (GPT-NeoX's: it keeps scores near 0).
Batches are pairs as nxd-data's `collate_pairs` makes them, with `score_position` per row (the
position of the last token that is not padding, where transformers' sequence classifiers read the
score too) and `margin` per row (the pair's, on both rows), or packed as its `collate_packed_pairs`
makes them (every sequence of the micro-batch a document of one row, with no padding between). The
model's per-position output stands where a causal LM's per-token cross-entropy would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .objectives import IGNORE_INDEX, Batch
from .preference import PreferenceTerms, WholeSequences

SCORE_POSITION_KEY = "score_position"
DOCUMENTS_KEY = "document_ids"
MARGIN_KEY = "margin"
REWARD_METRICS = ("accuracy", "margin", "rewards/chosen", "rewards/rejected")
"""What a reward model logs per pair, under TRL's names: chosen scored above rejected, the mean
difference of the scores, and the mean score of each."""


def reward_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, z_loss: float = 0.0, margin: torch.Tensor | None = None
) -> PreferenceTerms:
    """The pairwise loss per pair (see the module docstring) in fp64; the 'rewards' are the scores."""
    chosen, rejected = chosen.double(), rejected.double()
    difference = chosen - rejected - (0.0 if margin is None else margin.double())
    loss = -F.logsigmoid(difference) + z_loss * (chosen**2 + rejected**2)
    return PreferenceTerms(loss, chosen.detach(), rejected.detach())


def sequence_scores(token_scores: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Each sequence's score: the model's output at its `score_position` (compared with the global
    `position_ids`, so a part of the sequence holds it or adds 0). A packed batch (`document_ids`:
    nxd-data's `collate_packed_pairs`) holds the sequences as documents of its rows."""
    return _per_sequence(token_scores.float(), batch, at_score=True)


def sequence_label_counts(batch: Batch) -> torch.Tensor:
    """How many labels count in each sequence (0 for a padding pair's)."""
    return _per_sequence((batch["labels"] != IGNORE_INDEX).long(), batch, at_score=False)


def _per_sequence(values: torch.Tensor, batch: Batch, *, at_score: bool) -> torch.Tensor:
    """`values` summed per sequence (with `at_score`, only at its score position)."""
    positions = batch[SCORE_POSITION_KEY]
    if DOCUMENTS_KEY not in batch:  # one sequence a row
        return (values * (batch["position_ids"] == positions.unsqueeze(-1))).sum(-1) if at_score else values.sum(-1)
    documents, count = batch[DOCUMENTS_KEY], len(positions)  # document `count`: the row's padded tail
    if at_score:
        scored = torch.cat([positions, positions.new_full((1,), -1)])  # the tail scores nowhere
        values = values * (batch["position_ids"] == scored[documents])
    return document_sums(values, documents, count)


def document_sums(values: torch.Tensor, documents: torch.Tensor, count: int) -> torch.Tensor:
    """Per-position `values` summed per document (count,) of rows packed as `collate_packed_pairs` and
    `completion_rows` pack them: documents 0 .. count - 1, and `count` for the rows' padded tails (left out)."""
    sums = values.new_zeros(count + 1)
    return sums.index_add(0, documents.flatten(), values.flatten())[:count]


@dataclass(frozen=True)
class RewardObjective(WholeSequences):
    """The reward model's loss averaged over the pairs of the global batch."""

    z_loss: float = 0.0
    name: str = "reward_model"
    metric_names: tuple[str, ...] = REWARD_METRICS

    def _valid(self, batch: Batch) -> torch.Tensor:
        return (self._whole(sequence_label_counts(batch))[0::2] > 0).double()

    def count(self, batch: Batch) -> torch.Tensor:
        return self._valid(batch).sum() / self._parts

    def loss(self, token_losses: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        scores = self._whole(sequence_scores(token_losses, batch))
        margin = batch.get(MARGIN_KEY)
        terms = reward_loss(scores[0::2], scores[1::2], self.z_loss, None if margin is None else margin[0::2])
        valid = self._valid(batch)
        values = {
            "accuracy": terms.accuracies,
            "margin": terms.margins,
            "rewards/chosen": terms.chosen_rewards,
            "rewards/rejected": terms.rejected_rewards,
        }
        metrics = {name: (value.double() * valid).sum() / self._parts for name, value in values.items()}
        return (terms.loss * valid).sum() / self._parts, metrics
