"""Tensor parallelism for low-rank adapters (LoRA): y = W x + s B A x beside a sharded base layer W.

A plan names an adapter's two linear layers (A: in -> r, B: r -> out) with these styles, after its
base layer's:

- `lora_a_colwise` / `lora_b_colwise` (column-parallel base): A replicated, B split by output rows
  like W. A sees the whole input; each rank's B gives its rows only, so A's gradient and the input's
  gradient from the adapter are partial sums, summed over the tp ranks (with sequence parallelism the
  input's is reduce-scattered with the base layer's).
- `lora_b_colwise_kv`: B of a key/value projection: column-parallel, or with `kv_replicator` > 1
  replicated with each rank computing the head rows its query heads need (gradients summed).
- `lora_a_rowwise` / `lora_b_rowwise` (row-parallel base): A split by input columns like W, its
  partial r-dim outputs summed over the tp ranks (reduce-scattered along the sequence with sequence
  parallelism, where B then runs on this rank's sequence shard and its gradient is summed); B
  replicated.

Replicated parts are Replicate DTensors and split parts Shard DTensors, so checkpoints reshard them
like any other weight; the forward runs on local tensors and returns local tensors, which the
adapter wrapper adds to its base layer's (local) output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

from .errors import ParallelConfigError
from .kv_replication import HeadRows, SumGradOverGroup, replicated_heads, whole_input
from .tp_plans import LOW_RANK_STYLES

ADAPTED_STYLES = {
    "colwise": ("lora_a_colwise", "lora_b_colwise"),
    "colwise_kv": ("lora_a_colwise", "lora_b_colwise_kv"),
    "rowwise": ("lora_a_rowwise", "lora_b_rowwise"),
}
"""Base layer style -> the styles of its adapter's A and B."""


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class LowRankParallel(ParallelStyle):
    """One of `LOW_RANK_STYLES`, applied to a bias-free nn.Linear of an adapter."""

    def __init__(self, style: str, *, sequence_parallel: bool, kv_replicator: int = 1, head_dim: int | None = None):
        super().__init__()
        if style not in LOW_RANK_STYLES:
            raise ParallelConfigError(f"low-rank style {style!r}: expected one of {', '.join(LOW_RANK_STYLES)}")
        self.style, self.sequence_parallel = style, sequence_parallel
        self.kv_replicator, self.head_dim = kv_replicator, head_dim

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.Linear) or module.bias is not None:
            raise ParallelConfigError(f"{self.style}: expected a Linear without bias, found {module}")
        group, style = device_mesh.get_group(), self.style
        replicated_kv = style == "lora_b_colwise_kv" and self.kv_replicator > 1
        placement = {"lora_b_colwise": Shard(0), "lora_b_colwise_kv": Shard(0), "lora_a_rowwise": Shard(1)}
        weight = distribute_tensor(
            module.weight.data,
            device_mesh,
            [Replicate() if replicated_kv else placement.get(style, Replicate())],
            src_data_rank=None,
        )
        module.register_parameter("weight", nn.Parameter(weight, requires_grad=module.weight.requires_grad))
        sequence = [Shard(1)] if self.sequence_parallel else [Replicate()]

        if style == "lora_a_colwise":

            def forward(hidden: torch.Tensor) -> torch.Tensor:
                return F.linear(whole_input(hidden, group), SumGradOverGroup.apply(_local(module.weight), group))
        elif replicated_kv:
            heads = replicated_heads(
                module.out_features // self.head_dim,
                self.kv_replicator,
                device_mesh.size(),
                device_mesh.get_local_rank(),
            )
            rows = HeadRows(heads, self.head_dim, group)

            def forward(hidden: torch.Tensor) -> torch.Tensor:
                return F.linear(hidden, rows(_local(module.weight)))
        elif style in ("lora_b_colwise", "lora_b_colwise_kv"):

            def forward(hidden: torch.Tensor) -> torch.Tensor:
                return F.linear(hidden, _local(module.weight))
        elif style == "lora_a_rowwise":

            def forward(hidden: torch.Tensor) -> torch.Tensor:
                partial = DTensor.from_local(
                    F.linear(_local(hidden), _local(module.weight)), device_mesh, [Partial()], run_check=False
                )
                return partial.redistribute(device_mesh, sequence).to_local()
        else:  # lora_b_rowwise: on a sequence shard each rank's gradient is partial

            def forward(hidden: torch.Tensor) -> torch.Tensor:
                weight = _local(module.weight)
                return F.linear(hidden, SumGradOverGroup.apply(weight, group) if self.sequence_parallel else weight)

        module.forward = forward
        return module
