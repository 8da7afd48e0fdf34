"""GQA key/value projections when tp exceeds the KV heads: NxD's kv_replicator.

Each of the projection's heads is thought of as `kv_replicator` copies, and the tp ranks split the
copies. A rank keeps the whole, unreplicated weight (so checkpoints and exports keep the original
layout), computes only the heads its query heads need, and the gradients of the copies are summed
over the tp ranks, so every rank's weight stays identical.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial
from torch.distributed.tensor.parallel import ParallelStyle

from .errors import ParallelConfigError


class SumGradOverGroup(torch.autograd.Function):
    """Identity forward; backward sums the gradient over `group` (Megatron's copy-to-region)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def replicated_heads(num_heads: int, kv_replicator: int, tp: int, rank: int) -> list[int]:
    """The original head behind each head copy that tp rank `rank` computes, in order."""
    copies = num_heads * kv_replicator
    if copies % tp:
        raise ParallelConfigError(f"kv_replicator: {num_heads} KV heads x {kv_replicator} copies = {copies}; "
                                  f"expected a multiple of the tensor-parallel size {tp}")  # fmt: skip
    per_rank = copies // tp
    return [(rank * per_rank + index) // kv_replicator for index in range(per_rank)]


class ReplicatedKVParallel(ParallelStyle):
    """A Linear of `head_dim`-sized output heads, replicated `kv_replicator` times across the tp ranks."""

    def __init__(self, kv_replicator: int, head_dim: int, *, sequence_parallel: bool):
        super().__init__()
        self.kv_replicator = kv_replicator
        self.head_dim = head_dim
        self.sequence_parallel = sequence_parallel

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.Linear) or module.out_features % self.head_dim:
            raise ParallelConfigError(f"kv_replicator: expected a Linear with whole heads of {self.head_dim}, "
                                      f"found {module}")  # fmt: skip
        heads = replicated_heads(module.out_features // self.head_dim, self.kv_replicator, device_mesh.size(),
                                 device_mesh.get_local_rank())  # fmt: skip
        group, head_dim = device_mesh.get_group(), self.head_dim

        def forward(hidden: torch.Tensor) -> torch.Tensor:
            if isinstance(hidden, DTensor):  # sequence shards: gather; the input gradient is reduce-scattered
                hidden = hidden.full_tensor(grad_placements=[Partial()])
            else:  # replicated input: this rank's heads give part of its gradient
                hidden = SumGradOverGroup.apply(hidden, group)
            index = torch.tensor(heads, device=hidden.device)
            weight = SumGradOverGroup.apply(module.weight, group)
            weight = weight.view(-1, head_dim, weight.shape[-1]).index_select(0, index).flatten(0, 1)
            bias = None
            if module.bias is not None:
                bias = SumGradOverGroup.apply(module.bias, group).view(-1, head_dim).index_select(0, index).flatten()
            return F.linear(hidden, weight, bias)

        module.forward = forward
        return module
