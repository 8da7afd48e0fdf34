"""The preference losses of DPO and ORPO on per-sequence log-probs, and their objectives.

Both compare a chosen and a rejected response to the same prompt. DPO (Rafailov et al. 2023, the
sigmoid loss) scores each response by its summed log-prob under the policy against a frozen
reference; ORPO (Hong et al. 2024) needs no reference: the NLL of the chosen response plus beta times
-log sigmoid of the log odds-ratio of the two responses' average per-token probabilities.

The objectives read batches of pairs as nxd-data's `collate_pairs` makes them: row 2i a chosen
sequence, row 2i + 1 its rejected one, labels only on the responses; DPO's also carry
`reference_log_probs` (one per row). Each pair counts once: the loop divides the loss sum by the
pairs of the global batch. A sequence's log-prob is a sum over all its tokens, so the rows must be
whole on each rank (context parallelism splits them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .objectives import IGNORE_INDEX, Batch, token_cross_entropy


@dataclass(frozen=True)
class PreferenceTerms:
    """Per pair: the loss (differentiable) and what preference tools log (detached)."""

    loss: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor

    @property
    def margins(self) -> torch.Tensor:
        return self.chosen_rewards - self.rejected_rewards

    @property
    def accuracies(self) -> torch.Tensor:
        """1 where the chosen response is rewarded above the rejected one."""
        return (self.chosen_rewards > self.rejected_rewards).to(self.chosen_rewards.dtype)


def sequence_log_probs(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence (rows of `labels`): the fp32 sum of the log-probs of the labels that count, and how
    many count. Logits may be sharded over the vocabulary (see `token_cross_entropy`)."""
    counted = labels != IGNORE_INDEX
    log_probs = -token_cross_entropy(logits, labels).view(labels.shape)
    return (log_probs * counted).sum(-1), counted.sum(-1)


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, reference_chosen: torch.Tensor,
             reference_rejected: torch.Tensor, beta: float) -> PreferenceTerms:  # fmt: skip
    """DPO's sigmoid loss per pair from summed response log-probs: -log sigmoid(beta ((pi_c - ref_c) -
    (pi_r - ref_r))); the implicit rewards are beta (pi - ref)."""
    chosen = beta * (policy_chosen.float() - reference_chosen.float())
    rejected = beta * (policy_rejected.float() - reference_rejected.float())
    return PreferenceTerms(-F.logsigmoid(chosen - rejected), chosen.detach(), rejected.detach())


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, accurate over the whole range (Maechler 2012): log(-expm1(x)) near 0,
    log1p(-exp(x)) below -ln 2. The naive form is -inf (and its gradient NaN) as x nears 0. Each branch
    sees only inputs it is finite on, so the gradient of the branch not taken is 0, not NaN."""
    near, split = x > -math.log(2), torch.full_like(x, -math.log(2))
    return torch.where(near, torch.log(-torch.expm1(torch.where(near, x, split))),
                       torch.log1p(-torch.exp(torch.where(near, split, x))))  # fmt: skip


def orpo_loss(chosen_nll: torch.Tensor, chosen_mean_log_prob: torch.Tensor, rejected_mean_log_prob: torch.Tensor,
              beta: float) -> PreferenceTerms:  # fmt: skip
    """ORPO's loss per pair: the chosen response's NLL plus beta x -log sigmoid(log odds(chosen) - log
    odds(rejected)), odds = p / (1 - p) of the average per-token log-probs, in fp32 and finite for
    averages as close to 0 as the dtype holds (clamped to the smallest normal below 0). The rewards
    logged are beta x the average log-probs, as TRL reports them."""
    ceiling = -torch.finfo(torch.float32).tiny
    chosen = chosen_mean_log_prob.float().clamp(max=ceiling)
    rejected = rejected_mean_log_prob.float().clamp(max=ceiling)
    log_odds = (chosen - log1mexp(chosen)) - (rejected - log1mexp(rejected))
    loss = chosen_nll.float() - beta * F.logsigmoid(log_odds)
    return PreferenceTerms(loss, beta * chosen.detach(), beta * rejected.detach())


PAIR_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
                "logps/rejected")  # fmt: skip
"""What DPO and ORPO log per pair, under the names preference tools (TRL) use."""


def _pairs(batch: Batch) -> torch.Tensor:
    """1 for each real pair of the batch, 0 for padding pairs (no label counts)."""
    return (batch["labels"][0::2] != IGNORE_INDEX).any(-1).double()


def _sums(terms: PreferenceTerms, chosen: torch.Tensor, rejected: torch.Tensor,
          valid: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
    values = (terms.chosen_rewards, terms.rejected_rewards, terms.accuracies, terms.margins, chosen.detach(),
              rejected.detach())  # fmt: skip
    metrics = {name: (value.double() * valid).sum() for name, value in zip(PAIR_METRICS, values, strict=True)}
    return (terms.loss.double() * valid).sum(), metrics


@dataclass(frozen=True)
class DPOObjective:
    """DPO's sigmoid loss, the mean over the pairs of the global batch; the reference log-probs come
    with the batch (`reference_log_probs`)."""

    beta: float
    name: str = "dpo"
    metric_names: tuple[str, ...] = PAIR_METRICS

    def count(self, batch: Batch) -> torch.Tensor:
        return _pairs(batch).sum()

    def loss(self, logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        total, _ = sequence_log_probs(logits, batch["labels"])
        reference = batch["reference_log_probs"]
        terms = dpo_loss(total[0::2], total[1::2], reference[0::2], reference[1::2], self.beta)
        return _sums(terms, total[0::2], total[1::2], _pairs(batch))


@dataclass(frozen=True)
class ORPOObjective:
    """ORPO's loss, the mean over the pairs of the global batch; logs its NLL and log odds-ratio parts
    beside the pair metrics (log-probs there are per-token averages, as ORPO uses them)."""

    beta: float
    name: str = "orpo"
    metric_names: tuple[str, ...] = (*PAIR_METRICS, "nll_loss", "log_odds_ratio")

    def count(self, batch: Batch) -> torch.Tensor:
        return _pairs(batch).sum()

    def loss(self, logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        total, count = sequence_log_probs(logits, batch["labels"])
        mean = total / count.clamp(min=1)
        chosen, rejected = mean[0::2], mean[1::2]
        terms = orpo_loss(-chosen, chosen, rejected, self.beta)
        valid = _pairs(batch)
        loss, metrics = _sums(terms, chosen, rejected, valid)
        nll = -chosen.detach().double()
        metrics |= {"nll_loss": (nll * valid).sum(),
                    "log_odds_ratio": ((nll - terms.loss.detach().double()) / self.beta * valid).sum()}  # fmt: skip
        return loss, metrics
