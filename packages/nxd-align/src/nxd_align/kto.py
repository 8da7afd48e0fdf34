"""KTO (Ethayarajh et al. 2024): preference learning from unpaired examples, each completion labelled
desirable or undesirable, against a frozen reference and a KL baseline.

With r = log pi(y|x) - log pi_ref(y|x) (summed over the completion) and z the KL baseline (detached,
at least 0), a desirable example's loss is w_d (1 - sigmoid(beta (r - z))) and an undesirable one's
w_u (1 - sigmoid(beta (z - r))); the implicit reward is beta r. The baseline is estimated from
mismatched (prompt, completion) pairs, each prompt with another record's completion: the mean of their
policy-minus-reference log-probs over the step's global batch, clamped at 0 (TRL's estimate, gathered
over data-parallel ranks, is this one when a step is one micro-batch per rank).

Batches hold one row per example (nxd-data's KTO samples arrive as pairs of rows, the example and its
mismatched KL row; nxd-train measures the baseline on the KL rows and keeps the example rows), with
`kto_label` (1 desirable, 0 undesirable), `reference_log_probs` and the step's `kto_kl` (a scalar).

GPT-NeoX's estimate (`kl_estimate="batch_halves"`) needs no KL rows: a micro-batch's rows are split in
halves, each half's baseline is the mean over the other half's examples of max(0, their summed
log-ratio), and each row carries a reward (`kto_reward`) whose sign says desirable or undesirable and
whose size scales beta; an example whose reward is within 0.001 of 0 adds nothing to the loss (it
still counts in the mean and in its half's estimate). Where GPT-NeoX's own step differs, this follows
the KTO formula: NeoX multiplies beta by the reward averaged over the whole padded row (so by the share
of the row the document fills), weighs every row of a half by the mean of that half's weights, and
gives a zero-reward row 0.5 times that mean; here each example has its own weight and the document's
reward, whatever its length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .objectives import IGNORE_INDEX, Batch
from .preference import WholeSequences, sequence_log_probs
from .reference import REFERENCE_KEY

LABEL_KEY = "kto_label"
"""The batch entry holding each row's label: 1.0 desirable, 0.0 undesirable."""
KL_KEY = "kto_kl"
"""The batch entry holding the step's KL baseline (a scalar, the same on every rank)."""
REWARD_KEY = "kto_reward"
"""With GPT-NeoX's estimate: each row's reward (sign: desirable or not; size: a factor on beta)."""
NEUTRAL = 0.001
"""Rewards within this of 0 are neither desirable nor undesirable (GPT-NeoX's threshold)."""


@dataclass(frozen=True)
class KTOTerms:
    """Per example: the loss (differentiable) and the implicit reward beta r (detached)."""

    loss: torch.Tensor
    rewards: torch.Tensor


def kto_loss(
    policy: torch.Tensor,
    reference: torch.Tensor,
    desirable: torch.Tensor,
    kl: torch.Tensor | float,
    beta: torch.Tensor | float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> KTOTerms:
    """KTO's loss per example (see the module docstring) from summed completion log-probs, in fp64;
    `desirable` is boolean per example, `kl` the baseline (used as given: detached and clamped by its
    estimator; one value, or one per example), `beta` one value or one per example."""
    ratio = policy.double() - reference.double()
    kl = torch.as_tensor(kl, dtype=torch.float64, device=ratio.device)
    desirable = desirable.bool()
    loss = torch.where(
        desirable,
        desirable_weight * (1 - torch.sigmoid(beta * (ratio - kl))),
        undesirable_weight * (1 - torch.sigmoid(beta * (kl - ratio))),
    )
    return KTOTerms(loss, beta * ratio.detach())


def kl_baseline(
    policy: torch.Tensor,
    reference: torch.Tensor,
    valid: torch.Tensor,
    sum_over: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """KTO's KL baseline from mismatched rows: max(0, mean of policy - reference log-probs over the
    `valid` rows), in fp64 and detached; `sum_over` adds this rank's [sum, count] to the other ranks'
    holding the rest of the step's global batch (data parallelism)."""
    valid = valid.double()
    sums = torch.stack([((policy.double() - reference.double()) * valid).sum(), valid.sum()]).detach()
    if sum_over is not None:
        sums = sum_over(sums)
    return (sums[0] / sums[1].clamp(min=1)).clamp(min=0)


def halves_kl(policy: torch.Tensor, reference: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX's KL baseline per row of one micro-batch (detached, fp64): for each row of the first
    half, the mean over the `valid` rows of the second half of max(0, policy - reference), and the
    other way round (an odd row count gives the first half the extra row, as torch.chunk does)."""
    clamped = (policy.detach().double() - reference.double()).clamp(min=0)
    valid = valid.double()
    half = -(-len(clamped) // 2)
    means = [
        (clamped[part] * valid[part]).sum() / valid[part].sum().clamp(min=1)
        for part in (slice(0, half), slice(half, None))
    ]
    return torch.cat([means[1].expand(half), means[0].expand(len(clamped) - half)])


KTO_METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "kl",
    "share/chosen",
    "share/rejected",
)
"""What KTO logs, under TRL's names: means over the desirable (chosen) and undesirable (rejected)
examples of the global batch, their difference, the KL baseline, and the share of each kind."""


@dataclass(frozen=True)
class KTOObjective(WholeSequences):
    """KTO's loss averaged over the examples of the global batch (whole sequences under context
    parallelism, as `WholeSequences` says)."""

    beta: float
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0
    kl_estimate: str = "mismatched"
    """mismatched: the step's `kto_kl`; batch_halves: GPT-NeoX's, from the micro-batch (module docstring)."""
    name: str = "kto"
    metric_names: tuple[str, ...] = KTO_METRICS

    def _valid(self, labels: torch.Tensor) -> torch.Tensor:
        return (self._whole((labels != IGNORE_INDEX).sum(-1)) > 0).double()

    def count(self, batch: Batch) -> torch.Tensor:
        return self._valid(batch["labels"]).sum() / self._parts

    def loss(self, token_losses: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        total, count = sequence_log_probs(token_losses, batch["labels"])
        total, valid = self._whole(total), (self._whole(count) > 0).double()
        desirable, reference = batch[LABEL_KEY] > 0.5, batch[REFERENCE_KEY]
        if self.kl_estimate == "batch_halves":
            reward = batch[REWARD_KEY].double()
            kl, beta = halves_kl(total, reference, valid), self.beta * reward.abs()
            weight, undesirable = valid * (reward.abs() > NEUTRAL), reward < -NEUTRAL
        else:
            kl, beta, weight, undesirable = batch[KL_KEY], self.beta, valid, ~desirable
        terms = kto_loss(total, reference, desirable, kl, beta, self.desirable_weight, self.undesirable_weight)
        chosen, rejected = valid * desirable, valid * undesirable
        logps, rewards = total.detach(), self.beta * (total.detach() - reference.double())
        metrics = {
            "rewards/chosen": (rewards * chosen).sum(),
            "rewards/rejected": (rewards * rejected).sum(),
            "logps/chosen": (logps * chosen).sum(),
            "logps/rejected": (logps * rejected).sum(),
            "kl": (torch.as_tensor(kl, dtype=torch.float64) * valid).sum(),
            "share/chosen": chosen.sum(),
            "share/rejected": rejected.sum(),
        }
        parts = self._parts
        return (terms.loss * weight).sum() / parts, {name: value / parts for name, value in metrics.items()}

    def report(self, values: dict[str, float]) -> dict[str, float]:
        """The global means: reward and log-prob sums over the examples of each kind, divided by how
        many there were (the loop divided every sum by the global count, which cancels here), and
        rewards/margins, which `loss` does not sum, from them."""
        values = dict(values)
        for kind in ("chosen", "rejected"):
            share = values.get(f"share/{kind}", 0.0)
            for name in (f"rewards/{kind}", f"logps/{kind}"):
                if name in values:
                    values[name] = values[name] / share if share > 0 else float("nan")
        if "rewards/chosen" in values and "rewards/rejected" in values:
            values["rewards/margins"] = values["rewards/chosen"] - values["rewards/rejected"]
        return values
