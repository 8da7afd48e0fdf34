"""Statistics of a step's gradients and optimizer state (exp_manager.log_gradient_zeros, log_optimizer_states,
gradient_noise_scale), under GPT-NeoX's names; nxd-parallel computes each over the whole tensors, whatever the
layout, and gathers the pipeline stages' onto every rank."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from nxd_parallel import GradientNoiseScale, tensor_norms, zero_percentages
from nxd_precision import PrecisionOptimizer
from torch.distributed import ProcessGroup

PREFIXES = ("pct_grad_zeros/", "optimizer_state_norms/", "train/noise_scale")
"""What the statistics are logged as (NeoX's names)."""


@dataclass(frozen=True)
class StatisticsSettings:
    gradient_zeros: bool = False
    optimizer_states: bool = False
    noise_scale_batches: int | None = None
    """The gradient noise scale's n_batches; None: not estimated."""
    noise_scale_offload: bool = False

    @property
    def any(self) -> bool:
        return self.gradient_zeros or self.optimizer_states or self.noise_scale_batches is not None


class StepStatistics:
    """What a training step adds to the values it logs."""

    def __init__(
        self, settings: StatisticsSettings, names: Sequence[str], batch_size: int, stages: ProcessGroup | None
    ):
        """`names`: the trainable parameters', in the optimizer's order; `batch_size`: the global batch."""
        self.settings, self.names, self.stages = settings, list(names), stages
        self.noise = None
        if settings.noise_scale_batches is not None:
            self.noise = GradientNoiseScale(
                batch_size, settings.noise_scale_batches, offload=settings.noise_scale_offload
            )

    def gradients(self, optimizer: PrecisionOptimizer, logged: bool) -> dict[str, float]:
        """Before clipping, every step (the noise scale sees each); the values when the step is `logged`."""
        grads = {
            name: t.grad for name, t in zip(self.names, optimizer.gradient_tensors, strict=True) if t.grad is not None
        }
        values: dict[str, float] = {}
        if self.noise is not None:
            self.noise.update(grads, self.stages)
            if logged and self.noise.value is not None:
                values["train/noise_scale"] = self.noise.value
        if logged and self.settings.gradient_zeros:
            zeros = zero_percentages(grads, self.stages)
            values.update({f"pct_grad_zeros/{name}": zeros[name] for name in sorted(zeros)})
        return values

    def optimizer_states(self, optimizer: PrecisionOptimizer) -> dict[str, float]:
        """After the step: the norm of each state tensor of each parameter."""
        if not self.settings.optimizer_states:
            return {}
        states = {
            f"{name}_{key}": value
            for name, copy in zip(self.names, optimizer.gradient_tensors, strict=True)
            for key, value in optimizer.optimizer.state.get(copy, {}).items()
            if torch.is_tensor(value) and value.ndim
        }
        norms = tensor_norms(states, self.stages)
        return {f"optimizer_state_norms/{name}": norms[name] for name in sorted(norms)}
