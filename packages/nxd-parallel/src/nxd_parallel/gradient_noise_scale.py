"""The gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training"), estimated as
GPT-NeoX estimates it: the small batch is one step's global batch, the big batch the mean gradient of n_batches
steps in a row. With |G_small|^2 and |G_big|^2 the squared norms of the two gradients,

    |G|^2  ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(S)  ~ (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

each an exponential moving average (beta 0.99, bias-corrected by the count of steps seen), and the simple noise
scale B_simple = tr(S) / |G|^2. Unlike NeoX (one rank's gradients, refused under ZeRO), the norms here are global:
tensor-, data- and pipeline-parallel shards all count, so every layout estimates what one process does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch.distributed import ProcessGroup

from .norms import global_squares, local_part_and_groups


class GradientNoiseScale:
    """Feed it every optimizer step's gradients by name (`update`); `value` is the latest estimate, None until
    n_batches steps have been seen. The running sum of gradients is one copy of this rank's gradient shards (on the
    host with `offload`); a parameter without a gradient in a step adds nothing to it (its gradient is zero)."""

    def __init__(self, batch_size: int, n_batches: int, *, beta: float = 0.99, offload: bool = False):
        if n_batches < 2:
            raise ValueError(f"expected n_batches of at least 2 (the big batch is n_batches steps), found {n_batches}")
        self.small, self.big = batch_size, batch_size * n_batches
        self.n_batches, self.beta, self.offload = n_batches, beta, offload
        self.summed: dict[str, tuple[torch.Tensor, tuple]] = {}
        self.ema_squared: float | None = None
        self.ema_trace: float | None = None
        self.updates = 0
        self.value: float | None = None

    @torch.no_grad()
    def update(self, gradients: Mapping[str, torch.Tensor], across: ProcessGroup | None = None) -> None:
        """One step's gradients by parameter name (each the global batch's, possibly a shard); `across` holds the
        other pipeline stages. A step with a non-finite gradient is left out, as NeoX leaves out an overflow."""
        parts = {name: local_part_and_groups(gradient) for name, gradient in gradients.items()}
        device = next(iter(parts.values()))[0].device if parts else None
        small = global_squares(list(parts.values()), across, device).item()
        if not math.isfinite(small):
            return
        for name, (local, groups) in parts.items():
            if name in self.summed:
                self.summed[name][0].add_(local.to(self.summed[name][0].device, torch.float32))
            else:
                self.summed[name] = (
                    local.detach().to("cpu" if self.offload else local.device, torch.float32, copy=True),
                    groups,
                )
        if self.updates % self.n_batches == self.n_batches - 1:
            for total, _ in self.summed.values():
                total.div_(self.n_batches)  # the mean gradient of the n_batches steps
            big = global_squares(list(self.summed.values()), across, device).item()
            self.summed = {}
            squared = (self.big * big - self.small * small) / (self.big - self.small)
            trace = (small - big) / (1 / self.small - 1 / self.big)
            self.ema_squared, squared = _ema(self.ema_squared, self.beta, squared, self.updates)
            self.ema_trace, trace = _ema(self.ema_trace, self.beta, trace, self.updates)
            self.value = trace / squared
        self.updates += 1


def _ema(average: float | None, beta: float, value: float, index: int) -> tuple[float, float]:
    """The moving average after `value`, and it bias-corrected for `index` + 1 terms (NeoX's correction, which counts
    every step seen, not only the estimates)."""
    average = beta * (average or 0.0) + (1 - beta) * value
    return average, average / (1 - beta ** (index + 1))
