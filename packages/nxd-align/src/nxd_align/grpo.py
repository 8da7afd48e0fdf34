"""GRPO and its variants: the clipped policy-gradient loss on completions a run sampled itself.

A rollout batch holds, per row, one completion of a prompt (its tokens are the row's labels, the prompt's are
ignored), the row's advantage (`ADVANTAGE_KEY`), and per token the log-probs the completion had when it was
sampled (`OLD_KEY`, only when the batch trains more than one update: else the current ones, detached, so the
ratio is 1 and its gradient the plain policy gradient) and under the frozen reference (`REFERENCE_TOKENS_KEY`,
with beta > 0). The completions may also be packed as documents of rows (`document_ids` numbering them in the
advantages' order, a row's padded tail a document numbered after them; nxd-data's `completion_rows`): the per-token
values are then read per document. The loss follows TRL's GRPOTrainer term for term:

    ratio = exp(logp - old)                 per token, or per sequence (GSPO: the masked mean of logp - old)
    term  = -min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A) + beta * KL * ratio

with the KL estimator k3 (exp(ref - logp) - (ref - logp) - 1) unless GPT-NeoX's kl_impl names another (k1:
logp - ref, abs, mse: half its square). The loss types aggregate the terms differently, which `count` and
`loss` express as a sum over the global count the loop divides by:

- dapo: the mean over every completion token of the global batch;
- bnpo: each micro-batch's token mean, averaged over the micro-batches (TRL's per-device batch);
- grpo: each completion's token mean, averaged over the completions;
- dr_grpo: each completion's token sum over max_new_tokens, averaged over the completions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed import ProcessGroup

from .objectives import IGNORE_INDEX, Batch
from .reward import DOCUMENTS_KEY, document_sums

ADVANTAGE_KEY = "advantages"
"""A rollout batch's advantage of each completion (completions,): one a row, or a document each when packed."""
OLD_KEY = "old_log_probs"
"""The per-token log-probs of each row's completion when it was sampled (rows, seq), aligned with the labels."""
REFERENCE_TOKENS_KEY = "reference_token_log_probs"
"""The per-token log-probs of each row's completion under the reference model (rows, seq)."""

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
IMPORTANCE_LEVELS = ("token", "sequence")
KL_ESTIMATORS = ("k3", "k1", "abs", "mse")

CLIP_METRICS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")
TOKENS, UNITS = "_tokens", "_clip_units"
"""Helper sums `report` divides by, then drops: the completion tokens (the KL's mean), and what the clipped shares
are of (the completion tokens, or the completions at the sequence level)."""


def kl_estimate(log_probs: torch.Tensor, reference: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL of the policy from the reference, from the sampled tokens' log-probs: k3 (Schulman's unbiased,
    non-negative estimator, TRL's), k1 (the log ratio; NeoX's kl), abs (its magnitude), mse (half its square)."""
    if estimator == "k3":
        return torch.exp(reference - log_probs) - (reference - log_probs) - 1
    difference = log_probs - reference
    if estimator == "k1":
        return difference
    if estimator == "abs":
        return difference.abs()
    if estimator == "mse":
        return 0.5 * difference.square()
    raise ValueError(f"kl estimator: expected one of {', '.join(KL_ESTIMATORS)}, found {estimator!r}")


@dataclass(frozen=True)
class GRPOObjective:
    """The GRPO family's loss over rollout batches (module docstring); `max_new_tokens` is dr_grpo's normaliser."""

    max_new_tokens: int
    loss_type: str = "dapo"
    epsilon: float = 0.2
    epsilon_high: float | None = None
    """The upper clip (DAPO's clip-higher); None: epsilon."""
    importance_sampling: str = "token"
    beta: float = 0.0
    kl_estimator: str = "k3"
    kl_importance_correction: bool = True
    """The KL term weighted by the ratio (TRL's use_bias_correction_kl; GPT-NeoX's REINFORCE has none)."""
    name: str = "grpo"

    def __post_init__(self) -> None:
        for value, allowed, what in (
            (self.loss_type, LOSS_TYPES, "loss_type"),
            (self.importance_sampling, IMPORTANCE_LEVELS, "importance_sampling_level"),
            (self.kl_estimator, KL_ESTIMATORS, "kl_estimator"),
        ):
            if value not in allowed:
                raise ValueError(f"grpo {what}: expected one of {', '.join(allowed)}, found {value!r}")

    @property
    def metric_names(self) -> tuple[str, ...]:
        return (*(("kl",) if self.beta else ()), *CLIP_METRICS, TOKENS, UNITS)

    def count(self, batch: Batch) -> torch.Tensor:
        mask = batch["labels"] != IGNORE_INDEX
        if self.loss_type == "dapo":
            return mask.sum()
        if self.loss_type == "bnpo":
            return torch.ones((), dtype=torch.long, device=mask.device)
        return torch.tensor(len(batch[ADVANTAGE_KEY]), device=mask.device)

    def loss(self, token_losses: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        completions = Completions(batch)
        mask = (batch["labels"] != IGNORE_INDEX).double()
        log_probs = -token_losses.double()
        old = batch.get(OLD_KEY)
        old = log_probs.detach() if old is None else old.double()
        advantages = batch[ADVANTAGE_KEY].double()
        log_ratio = log_probs - old
        if self.importance_sampling == "sequence":
            log_ratio = completions.sums(log_ratio * mask) / completions.sums(mask).clamp(min=1.0)
            ratio = torch.exp(log_ratio)  # one a completion
            token_ratio, token_advantages = completions.spread(ratio), completions.spread(advantages)
        else:
            ratio = token_ratio = torch.exp(log_ratio)
            advantages = token_advantages = completions.spread(advantages)
        low, high = self.epsilon, self.epsilon if self.epsilon_high is None else self.epsilon_high
        clipped = torch.clamp(token_ratio, 1 - low, 1 + high)
        terms = -torch.min(token_ratio * token_advantages, clipped * token_advantages)
        metrics: dict[str, torch.Tensor] = {}
        if self.beta:
            kl = kl_estimate(log_probs, batch[REFERENCE_TOKENS_KEY].double(), self.kl_estimator)
            if self.kl_importance_correction:  # 1 on the sampling policy, but it adds KL x grad log p
                kl = kl * token_ratio
            terms = terms + self.beta * kl
            metrics["kl"] = (kl.detach() * mask).sum()
        terms = terms * mask
        if self.loss_type == "dapo":
            total = terms.sum()
        elif self.loss_type == "bnpo":
            total = terms.sum() / mask.sum().clamp(min=1.0)
        elif self.loss_type == "grpo":
            total = (completions.sums(terms) / completions.sums(mask).clamp(min=1.0)).sum()
        else:
            total = terms.sum() / self.max_new_tokens
        # clipped shares, as TRL logs them: of the completion tokens, or per sequence of the completions
        ratio = ratio.detach()
        low_clipped = ((ratio < 1 - low) & (advantages < 0)).double()
        high_clipped = ((ratio > 1 + high) & (advantages > 0)).double()
        weight = mask if self.importance_sampling == "token" else torch.ones_like(ratio)
        metrics.update(
            {
                "clip_ratio/low_mean": (low_clipped * weight).sum(),
                "clip_ratio/high_mean": (high_clipped * weight).sum(),
                "clip_ratio/region_mean": ((low_clipped + high_clipped) * weight).sum(),
                TOKENS: mask.sum(),
                UNITS: weight.sum(),
            }
        )
        return total, metrics

    def split_over(self, group: ProcessGroup | None) -> GRPOObjective:
        if group is not None:
            raise ValueError("grpo: rollouts are whole sequences; context parallelism does not split them")
        return self

    def report(self, values: dict[str, float]) -> dict[str, float]:
        """Token means of the KL and the clipped shares (the loop's division by the global count cancels)."""
        values = dict(values)
        tokens, units = values.pop(TOKENS, 0.0), values.pop(UNITS, 0.0)
        for name, share in (("kl", tokens), *((name, units) for name in CLIP_METRICS)):
            if name in values:
                values[name] = values[name] / share if share > 0 else float("nan")
        return values


class Completions:
    """Where a batch's completions are: one a row, or packed as documents of rows (`document_ids`)."""

    def __init__(self, batch: Batch):
        self.documents, self.count = batch.get(DOCUMENTS_KEY), len(batch[ADVANTAGE_KEY])

    def sums(self, values: torch.Tensor) -> torch.Tensor:
        """Per-token `values` summed per completion (completions,)."""
        return values.sum(-1) if self.documents is None else document_sums(values, self.documents, self.count)

    def spread(self, values: torch.Tensor) -> torch.Tensor:
        """One value a completion (completions,) at each of its tokens (0 on a padded tail), broadcastable."""
        if self.documents is None:
            return values.unsqueeze(-1)
        return torch.cat([values, values.new_zeros(1)])[self.documents]
