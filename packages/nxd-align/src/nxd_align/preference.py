"""The preference losses of DPO and ORPO on per-sequence log-probs, and their objectives.

Both compare a chosen and a rejected response to the same prompt. DPO (Rafailov et al. 2023, the
sigmoid loss) scores each response by its summed log-prob under the policy against a frozen
reference; ORPO (Hong et al. 2024) needs no reference: the NLL of the chosen response plus beta times
-log sigmoid of the log odds-ratio of the two responses' average per-token probabilities.

The objectives read batches of pairs as nxd-data's `collate_pairs` makes them: row 2i a chosen
sequence, row 2i + 1 its rejected one, labels only on the responses; DPO's also carry
`reference_log_probs` (one per row). Each pair counts once: the loop divides the loss sum by the
pairs of the global batch. A sequence's log-prob is a sum over all its tokens: under context
parallelism the objectives add each row's parts over the sequence's ranks first (`split_over`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch.distributed import ProcessGroup

from .objectives import IGNORE_INDEX, Batch


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


def sequence_log_probs(token_losses: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence (rows of `labels`): the sum of the log-probs of the labels that count (minus their
    per-token cross-entropy `token_losses`), in fp64 (a sum near -100 in fp32 would keep only about 6
    digits, and DPO subtracts two such sums), and how many count."""
    counted = labels != IGNORE_INDEX
    return (-token_losses.double() * counted).sum(-1), counted.sum(-1)


DPO_LOSS_TYPES = ("sigmoid", "ipo", "hinge", "robust")


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    lengths: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> PreferenceTerms:
    """DPO's loss per pair from summed response log-probs, in fp64 (the differences of large sums), with
    h = (pi_c - ref_c) - (pi_r - ref_r) and the implicit rewards beta (pi - ref):
    - sigmoid (Rafailov et al. 2023): -log sigmoid(beta h); with label_smoothing e, the conservative
      form (cDPO) -(1 - e) log sigmoid(beta h) - e log sigmoid(-beta h);
    - robust (Chowdhury et al. 2024): (-(1 - e) log sigmoid(beta h) + e log sigmoid(-beta h)) / (1 - 2e);
    - hinge (SLiC): max(0, 1 - beta h);
    - ipo (Azar et al. 2023): (h' - 1 / (2 beta))^2, h' from log-ratios averaged per response token
      (`lengths`: the chosen and rejected responses' token counts), as TRL computes it."""
    chosen_ratio = policy_chosen.double() - reference_chosen.double()
    rejected_ratio = policy_rejected.double() - reference_rejected.double()
    margin = chosen_ratio - rejected_ratio
    if loss_type == "sigmoid":
        loss = -(1 - label_smoothing) * F.logsigmoid(beta * margin) - label_smoothing * F.logsigmoid(-beta * margin)
    elif loss_type == "robust":
        loss = (
            -(1 - label_smoothing) * F.logsigmoid(beta * margin) + label_smoothing * F.logsigmoid(-beta * margin)
        ) / (1 - 2 * label_smoothing)
    elif loss_type == "hinge":
        loss = torch.relu(1 - beta * margin)
    elif loss_type == "ipo":
        if lengths is None:
            raise ValueError("dpo_loss: the ipo loss needs the responses' token counts (lengths)")
        chosen_length, rejected_length = (length.double().clamp(min=1) for length in lengths)
        loss = (chosen_ratio / chosen_length - rejected_ratio / rejected_length - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"loss_type: expected one of {', '.join(DPO_LOSS_TYPES)}, found {loss_type!r}")
    return PreferenceTerms(loss, beta * chosen_ratio.detach(), beta * rejected_ratio.detach())


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, accurate over the whole range (Maechler 2012): log(-expm1(x)) near 0,
    log1p(-exp(x)) below -ln 2. The naive form is -inf (and its gradient NaN) as x nears 0. Each branch
    sees only inputs it is finite on, so the gradient of the branch not taken is 0, not NaN."""
    near, split = x > -math.log(2), torch.full_like(x, -math.log(2))
    return torch.where(
        near, torch.log(-torch.expm1(torch.where(near, x, split))), torch.log1p(-torch.exp(torch.where(near, split, x)))
    )


def orpo_loss(
    chosen_nll: torch.Tensor, chosen_mean_log_prob: torch.Tensor, rejected_mean_log_prob: torch.Tensor, beta: float
) -> PreferenceTerms:
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


PAIR_METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
)
"""What DPO and ORPO log per pair, under the names preference tools (TRL) use."""


def _sums(
    terms: PreferenceTerms, chosen: torch.Tensor, rejected: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    values = (
        terms.chosen_rewards,
        terms.rejected_rewards,
        terms.accuracies,
        terms.margins,
        chosen.detach(),
        rejected.detach(),
    )
    metrics = {name: (value.double() * valid).sum() for name, value in zip(PAIR_METRICS, values, strict=True)}
    return (terms.loss.double() * valid).sum(), metrics


@dataclass(frozen=True)
class WholeSequences:
    """What objectives on whole-sequence values (summed log-probs, a score) share under context
    parallelism (`sequence_group`: each rank holds part of every sequence): each row's partial sums
    are added over the group, differentiably, so every rank sees whole sequences, and each rank
    reports 1 / group size of the items, loss and metrics, so that summing over the ranks counts each
    item once and the gradient is that of one process."""

    sequence_group: ProcessGroup | None = field(default=None, kw_only=True)

    def split_over(self, group: ProcessGroup | None) -> WholeSequences:
        """This objective on sequences split over `group` (None: whole on each rank)."""
        return replace(self, sequence_group=group)

    @property
    def _parts(self) -> int:
        return 1 if self.sequence_group is None else dist.get_world_size(self.sequence_group)

    def _whole(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.sequence_group is None:
            return tensor
        return funcol.wait_tensor(funcol.all_reduce(tensor, "sum", self.sequence_group))

    def report(self, values: dict[str, float]) -> dict[str, float]:
        """Unchanged: every metric is a mean over the items."""
        return values

    def _valid_pairs(self, labels: torch.Tensor) -> torch.Tensor:
        """For batches of pairs: 1 for each real pair, 0 for padding pairs (no label counts on any part)."""
        return (self._whole((labels != IGNORE_INDEX).sum(-1))[0::2] > 0).double()


@dataclass(frozen=True)
class PairObjective(WholeSequences):
    """What DPO and ORPO share: a loss per pair from whole-sequence log-probs, averaged over the pairs
    of the global batch."""

    beta: float

    def count(self, batch: Batch) -> torch.Tensor:
        return self._valid_pairs(batch["labels"]).sum() / self._parts

    def loss(self, token_losses: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        total, count = sequence_log_probs(token_losses, batch["labels"])
        loss, metrics = self.pair_sums(self._whole(total), self._whole(count), batch)
        return loss / self._parts, {name: value / self._parts for name, value in metrics.items()}


@dataclass(frozen=True)
class DPOObjective(PairObjective):
    """DPO (`loss_type` as `dpo_loss` lists); the reference log-probs come with the batch
    (`reference_log_probs`, one per row), or are 0 with `reference_free` (no reference model)."""

    name: str = "dpo"
    metric_names: tuple[str, ...] = PAIR_METRICS
    loss_type: str = "sigmoid"
    label_smoothing: float = 0.0
    reference_free: bool = False

    def pair_sums(
        self, total: torch.Tensor, count: torch.Tensor, batch: Batch
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        reference = torch.zeros_like(total) if self.reference_free else batch["reference_log_probs"]
        terms = dpo_loss(
            total[0::2],
            total[1::2],
            reference[0::2],
            reference[1::2],
            self.beta,
            self.loss_type,
            self.label_smoothing,
            (count[0::2], count[1::2]),
        )
        return _sums(terms, total[0::2], total[1::2], (count[0::2] > 0).double())


@dataclass(frozen=True)
class ORPOObjective(PairObjective):
    """ORPO's loss; logs its NLL and log odds-ratio parts beside the pair metrics (log-probs there are
    per-token averages, as ORPO uses them)."""

    name: str = "orpo"
    metric_names: tuple[str, ...] = (*PAIR_METRICS, "nll_loss", "log_odds_ratio")

    def pair_sums(
        self, total: torch.Tensor, count: torch.Tensor, batch: Batch
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mean = total / count.clamp(min=1)
        chosen, rejected = mean[0::2], mean[1::2]
        terms = orpo_loss(-chosen, chosen, rejected, self.beta)
        valid = (count[0::2] > 0).double()
        loss, metrics = _sums(terms, chosen, rejected, valid)
        nll = -chosen.detach().double()
        metrics |= {
            "nll_loss": (nll * valid).sum(),
            "log_odds_ratio": ((nll - terms.loss.detach().double()) / self.beta * valid).sum(),
        }
        return loss, metrics
