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
from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor
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
        raise ParallelConfigError(
            f"kv_replicator: {num_heads} KV heads x {kv_replicator} copies = {copies}; "
            f"expected a multiple of the tensor-parallel size {tp}"
        )
    per_rank = copies // tp
    return [(rank * per_rank + index) // kv_replicator for index in range(per_rank)]


def whole_input(hidden: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """A projection's input as a whole local tensor whose gradient is summed over the tp ranks: sequence
    shards (a DTensor) are gathered and their gradient reduce-scattered; a replicated input's gradient
    is all-reduced, since each rank's heads give only part of it."""
    if isinstance(hidden, DTensor):
        return hidden.full_tensor(grad_placements=[Partial()])
    return SumGradOverGroup.apply(hidden, group)


class HeadRows:
    """The rows of the listed `head_dim`-sized heads of a replicated weight or bias, as one rank
    computes them; the gradients of all copies of a head are summed over `group`, so the replicated
    tensor stays identical. The index tensor is made once per device, not on every forward."""

    def __init__(self, heads: list[int], head_dim: int, group: dist.ProcessGroup):
        self.heads, self.head_dim, self.group = heads, head_dim, group
        self._index: dict[torch.device, torch.Tensor] = {}

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        if (index := self._index.get(tensor.device)) is None:
            index = self._index[tensor.device] = torch.tensor(self.heads, device=tensor.device)
        rows = SumGradOverGroup.apply(tensor, self.group).view(-1, self.head_dim, *tensor.shape[1:])
        return rows.index_select(0, index).flatten(0, 1)


class ReplicatedKVParallel(ParallelStyle):
    """A Linear of `head_dim`-sized output heads, replicated `kv_replicator` times across the tp ranks."""

    def __init__(self, kv_replicator: int, head_dim: int):
        super().__init__()
        self.kv_replicator = kv_replicator
        self.head_dim = head_dim

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.Linear) or module.out_features % self.head_dim:
            raise ParallelConfigError(
                f"kv_replicator: expected a Linear with whole heads of {self.head_dim}, found {module}"
            )
        heads = replicated_heads(
            module.out_features // self.head_dim, self.kv_replicator, device_mesh.size(), device_mesh.get_local_rank()
        )
        group = device_mesh.get_group()
        rows = HeadRows(heads, self.head_dim, group)

        def forward(hidden: torch.Tensor) -> torch.Tensor:
            bias = None if module.bias is None else rows(module.bias)
            return F.linear(whole_input(hidden, group), rows(module.weight), bias)

        module.forward = forward
        return module


class QKVParallel(ParallelStyle):
    """A fused query/key/value module (`weight_q/k/v`, `bias_q/k/v` and `project(hidden, weights,
    biases)`, as nxd-models' QKVLinear): every projection split by heads over the tp ranks, or with
    `kv_replicator` > 1 the keys and values as replicated heads."""

    def __init__(self, kv_replicator: int, head_dim: int | None):
        super().__init__()
        self.kv_replicator = kv_replicator
        self.head_dim = head_dim

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        group, replicate_kv = device_mesh.get_group(), self.kv_replicator > 1
        for name in ("q",) if replicate_kv else ("q", "k", "v"):
            for kind in ("weight", "bias"):
                if (parameter := getattr(module, f"{kind}_{name}")) is not None:
                    shards = distribute_tensor(parameter.data, device_mesh, [Shard(0)], src_data_rank=None)
                    module.register_parameter(f"{kind}_{name}", nn.Parameter(shards))
        rows = None
        if replicate_kv:
            heads = replicated_heads(
                module.weight_k.shape[0] // self.head_dim,
                self.kv_replicator,
                device_mesh.size(),
                device_mesh.get_local_rank(),
            )
            rows = HeadRows(heads, self.head_dim, group)

        def part(tensor: torch.Tensor | None) -> torch.Tensor | None:
            """This rank's slice: a head shard's local tensor, or the heads it needs of a replicated one."""
            if tensor is None:
                return None
            return tensor.to_local() if isinstance(tensor, DTensor) else rows(tensor)

        def forward(hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            weights = tuple(part(getattr(module, f"weight_{name}")) for name in "qkv")
            biases = tuple(part(getattr(module, f"bias_{name}")) for name in "qkv")
            return module.project(whole_input(hidden, group), weights, biases)

        module.forward = forward
        return module
