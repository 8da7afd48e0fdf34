"""Mixture-of-experts layers across ranks: experts split over the expert-parallel ranks (ep), each
expert's ffn split over the tensor-parallel ranks (tp), tokens sent to their experts' ranks and back
by all-to-all.

A model marks its MoE layers with the "moe" style in its TP plan. Such a module has `experts`, whose
stacked parameters are `up_proj` (and `gate_proj`) of shape (experts, ffn, hidden) and `down_proj`
(experts, hidden, ffn), called as `experts(rows, counts)` to run this rank's experts and a
`gradient_scale`; and `dispatch`, the callable (rows, counts per expert, experts) -> the experts'
outputs of those rows, which this module replaces (nxd-models' `MoELayer` is such a module).

Routing stays where the tokens are: each rank routes its own micro-batch (capacity included) as one
process would, so only the experts' work moves. Under tensor parallelism every tp rank routes the
same tokens and computes its slice of each expert's ffn; the slices' outputs are summed over tp
before they are weighed. The experts' gradients sum the tokens of the whole ep group, which the
loss scale already counts once per data-parallel rank: they are scaled by 1 / ep.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor

from .tp_plans import MOE_STYLE


def moe_modules(model: nn.Module, plan: Mapping[str, str]) -> list[nn.Module]:
    """The modules of `model` that `plan` marks "moe"."""
    names = [name for name, _ in model.named_modules()]
    return [
        model.get_submodule(name)
        for pattern, style in plan.items()
        if style == MOE_STYLE
        for name in fnmatch.filter(names, pattern)
    ]


def apply_expert_parallel(
    layers: list[nn.Module],
    experts_mesh: DeviceMesh,
    *,
    sequence_parallel: bool = False,
    reduce_dtype: torch.dtype | None = None,
) -> None:
    """Split the experts of each MoE layer of `layers` (meta or not) over `experts_mesh`, whose dimensions
    are `ep` (whole experts), `tp` (each expert's ffn) or both, and route their tokens accordingly;
    `reduce_dtype` is the dtype of the sum of the ffn slices over tp (None: the activations')."""
    names = experts_mesh.mesh_dim_names or ()
    ep = experts_mesh["ep"] if "ep" in names else None
    tp = experts_mesh["tp"] if "tp" in names else None
    for layer in layers:
        experts = layer.experts
        for key, parameter in list(experts.named_parameters(recurse=False)):
            ffn_dim = 2 if key == "down_proj" else 1
            placements: list[Placement] = [Shard(0) if name == "ep" else Shard(ffn_dim) for name in names]
            sharded = distribute_tensor(parameter.data, experts_mesh, placements, src_data_rank=None)
            experts.register_parameter(key, nn.Parameter(sharded, parameter.requires_grad))
        if ep is not None:
            experts.gradient_scale = 1.0 / ep.size()
        layer.dispatch = ExpertDispatch(ep, tp, reduce_dtype)
        if tp is not None:
            layer.register_forward_pre_hook(_whole_input(tp))
            if sequence_parallel:
                layer.register_forward_hook(_sequence_shard(tp))


class ExpertDispatch:
    """Rows grouped by expert -> their experts' ranks (all-to-all over ep) -> this rank's experts (their
    ffn slices summed over tp) -> back, in the order they came."""

    def __init__(self, ep: DeviceMesh | None, tp: DeviceMesh | None, reduce_dtype: torch.dtype | None = None):
        self.ep, self.tp, self.reduce_dtype = ep, tp, reduce_dtype

    def __call__(self, rows: torch.Tensor, counts: torch.Tensor, experts: nn.Module) -> torch.Tensor:
        if self.ep is None:
            return self._compute(rows, counts.tolist(), experts)
        group, ranks = self.ep.get_group(), self.ep.size()
        local_experts = counts.numel() // ranks
        received_counts = torch.empty_like(counts)
        dist.all_to_all_single(received_counts, counts, group=group)
        by_source = received_counts.view(ranks, local_experts).tolist()  # [source][expert]: rows
        sent = counts.view(ranks, local_experts).sum(1).tolist()
        arrived = [sum(row) for row in by_source]
        received = wait_tensor(all_to_all_single_autograd(rows.contiguous(), arrived, sent, group))
        order = _expert_major(by_source).to(rows.device)
        outputs = self._compute(received[order], [sum(column) for column in zip(*by_source, strict=True)], experts)
        back = torch.empty_like(outputs).index_copy(0, order, outputs)  # source-major again
        return wait_tensor(all_to_all_single_autograd(back, sent, arrived, group))

    def _compute(self, rows: torch.Tensor, counts: list[int], experts: nn.Module) -> torch.Tensor:
        if self.tp is None:
            return experts(rows, counts)
        rows = DTensor.from_local(rows, self.tp, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])
        partial = experts(rows, counts)
        dtype = partial.dtype
        summed = DTensor.from_local(partial.to(self.reduce_dtype or dtype), self.tp, [Partial()], run_check=False)
        return summed.redistribute(self.tp, [Replicate()]).to_local().to(dtype)


def _expert_major(by_source: list[list[int]]) -> torch.Tensor:
    """The permutation from rows received source by source (each source's rows grouped by expert) to
    rows grouped by expert (each expert's rows source by source)."""
    starts, offset = [], 0
    for row in by_source:
        starts.append([])
        for count in row:
            starts[-1].append(offset)
            offset += count
    pieces = [
        torch.arange(starts[source][expert], starts[source][expert] + by_source[source][expert])
        for expert in range(len(by_source[0]))
        for source in range(len(by_source))
    ]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)


def _whole_input(tp: DeviceMesh):  # noqa: ANN202
    """Forward pre-hook: the layer routes the whole hidden states (gathered from sequence shards)."""

    def hook(_: nn.Module, args: tuple) -> tuple:
        hidden = args[0]
        if isinstance(hidden, DTensor):
            hidden = hidden.redistribute(tp, [Replicate()]).to_local()
        return (hidden, *args[1:])

    return hook


def _sequence_shard(tp: DeviceMesh):  # noqa: ANN202
    """Forward hook: the layer's whole output -> this rank's sequence shard (the residual stream's)."""

    def hook(_: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        whole = DTensor.from_local(output, tp, [Replicate()], run_check=False)
        return whole.redistribute(tp, [Shard(1)]).to_local()

    return hook
