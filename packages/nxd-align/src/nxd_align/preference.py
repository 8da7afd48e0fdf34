"""The preference losses of DPO and ORPO on per-sequence log-probs.

Both compare a chosen and a rejected response to the same prompt. DPO (Rafailov et al. 2023, the
sigmoid loss) scores each response by its summed log-prob under the policy against a frozen
reference; ORPO (Hong et al. 2024) needs no reference: the NLL of the chosen response plus beta times
-log sigmoid of the log odds-ratio of the two responses' average per-token probabilities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .objectives import IGNORE_INDEX, token_cross_entropy


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
