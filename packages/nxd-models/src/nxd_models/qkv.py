"""NxD's GQAQKVLinear (`model.qkv_linear`): the query, key and value projections as one module.

With `fuse` (`model.fuse_qkv`) the three are computed by one matmul over the concatenated weights.
The weights stay three parameters (`weight_q`, `weight_k`, `weight_v`), so tensor parallelism splits
each by heads and checkpoints keep each projection's layout. A sharding wrapper calls `project`
with the weights each rank holds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class QKVLinear(nn.Module):
    def __init__(self, hidden_size: int, query_size: int, kv_size: int, *, bias: bool, fuse: bool):
        super().__init__()
        self.fuse = fuse
        for name, rows in (("q", query_size), ("k", kv_size), ("v", kv_size)):
            self.register_parameter(f"weight_{name}", nn.Parameter(torch.empty(rows, hidden_size)))
            self.register_parameter(f"bias_{name}", nn.Parameter(torch.empty(rows)) if bias else None)

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.project(
            hidden, (self.weight_q, self.weight_k, self.weight_v), (self.bias_q, self.bias_k, self.bias_v)
        )

    def project(
        self,
        hidden: torch.Tensor,
        weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        biases: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(query, key, value) of `hidden` with the given weights (the whole ones, or a rank's slices)."""
        if not self.fuse:
            return tuple(F.linear(hidden, weight, bias) for weight, bias in zip(weights, biases, strict=True))
        bias = None if biases[0] is None else torch.cat(biases)
        fused = F.linear(hidden, torch.cat(weights), bias)
        return fused.split([weight.shape[0] for weight in weights], dim=-1)


def qkv_part_unit(name: str, part: str) -> str:
    """The initialisation unit of QKV module `name`'s `part` ("q", "k" or "v"): the separate projection
    it stands for, so that fusing changes no initial value."""
    return f"{name.rpartition('.')[0]}.{part}_proj"
