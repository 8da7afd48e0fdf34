"""Apply a model's declared TP plan (module-name pattern -> style) with DTensor's parallel styles.

Styles a plan may name:

- `colwise` / `rowwise`: Megatron's column- and row-parallel linear layers.
- `colwise_kv`: a key or value projection; column-parallel, or with `kv_replicator` > 1 replicated
  heads (see `kv_replication.py`).
- `qkv`: a fused query/key/value module (NxD's GQAQKVLinear), split by heads the same way.
- `vocab`: vocab-parallel embedding; its output is whole and replicated.
- `colwise_output`: the output layer; logits stay sharded over the vocabulary for `vocab_parallel_token_losses`.
- `score`: a reward model's output layer (one output): row-parallel over the hidden size, its partial
  scores summed over the ranks, whole on each.
- `sequence`: a norm that runs on sequence shards when sequence parallelism is on (replicated otherwise).
- `moe`: a mixture-of-experts layer; its experts' ffn is split over the tp ranks by
  `apply_expert_parallel` (see `expert_parallel.py`), its router replicated.
- `heads`: a table with one column per query head (GPT-NeoX's rpe buckets x heads): each rank keeps its
  heads' columns and reads its local part; no activation crosses ranks.
- `replicated_with_grad_allreduce` (transformers' name): a module that sees a slice of the heads (dim 2);
  weights replicated, gradients summed over the tp ranks.
- `lora_a_*` / `lora_b_*`: the two halves of a low-rank adapter beside a sharded base layer (see
  `low_rank.py`). An adapter wrapper holds its base layer as `base_layer` (peft's convention): the
  wrapper, not the base layer, is then the projection whose block gathers the sequence once.

With sequence parallelism the residual stream between the layers is split along the sequence: the
first decoder layer scatters its input (`enter_sequence_parallel`), row-parallel outputs
reduce-scatter, and the block holding column-parallel projections (attention, MLP) all-gathers its
input once for all of them.
`reduce_dtype` is the dtype of those forward and backward reductions.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from .errors import ParallelConfigError
from .kv_replication import QKVParallel, ReplicatedKVParallel
from .low_rank import LowRankParallel
from .ties import retie, tied_parameters
from .tp_plans import LOW_RANK_STYLES, MOE_STYLE, check_plan

_GATHERED_ONCE = ("colwise", "colwise_kv", "qkv")
"""Styles whose parent block's input is gathered once under sequence parallelism."""

BASE_LAYER = ".base_layer"
"""Where an adapter wrapper keeps the layer it adapts."""


class _GradInDtype(torch.autograd.Function):
    """Identity forward; the gradient flows back in `dtype`, so the reduction DTensor runs next uses it."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        ctx.dtype = dtype
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.to(ctx.dtype), None


class _ColwiseReducing(ColwiseParallel):
    """Column-parallel whose input-gradient reduction (all-reduce, or reduce-scatter with SP) runs in
    `reduce_dtype`."""

    def __init__(self, *, reduce_dtype: torch.dtype | None, **kwargs: Any):
        super().__init__(**kwargs)
        self.reduce_dtype = reduce_dtype

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        module = super()._apply(module, device_mesh)
        if self.reduce_dtype is not None:
            dtype = self.reduce_dtype
            module.register_forward_pre_hook(lambda _, args: (_GradInDtype.apply(args[0], dtype), *args[1:]))
        return module


class _RowwiseReducing(RowwiseParallel):
    """Row-parallel (or vocab-parallel embedding) whose output all-reduce / reduce-scatter runs in `reduce_dtype`."""

    def __init__(self, *, reduce_dtype: torch.dtype | None, **kwargs: Any):
        super().__init__(**kwargs)
        self.reduce_dtype = reduce_dtype

    def _prepare_output_fn(self, output_layouts, use_local_output, mod, outputs, device_mesh):  # noqa: ANN001, ANN202
        dtype = outputs.dtype
        if self.reduce_dtype is None or self.reduce_dtype == dtype:
            return RowwiseParallel._prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh)
        outputs = outputs.to(self.reduce_dtype).redistribute(placements=output_layouts).to(dtype)
        return outputs.to_local() if use_local_output else outputs


def _scatter_sequence(mesh: DeviceMesh):  # noqa: ANN202
    """Forward pre-hook: the first layer's whole hidden states -> this rank's sequence shard."""

    def hook(_: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        whole = DTensor.from_local(args[0], mesh, [Replicate()], run_check=False)
        return (whole.redistribute(mesh, [Shard(1)]).to_local(), *args[1:]), kwargs

    return hook


def _gather_sequence_once(mesh: DeviceMesh):  # noqa: ANN202
    """Forward pre-hook on a block whose input feeds only column-parallel projections (attention,
    MLP): gather the sequence shards once for all of them (and reduce-scatter their gradients once)."""

    def gather(hidden: object) -> object:
        if isinstance(hidden, DTensor) and hidden.placements[0].is_shard():
            return hidden.redistribute(mesh, [Replicate()])
        return hidden

    def hook(_: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (gather(args[0]), *args[1:]), kwargs
        if "hidden_states" in kwargs:  # transformers calls its blocks with keywords
            kwargs = {**kwargs, "hidden_states": gather(kwargs["hidden_states"])}
        return args, kwargs

    return hook


class _HeadColumns(ParallelStyle):
    """Every parameter of the module split along dimension 1 (its heads); the module reads its local part."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def shard(_: str, owner: nn.Module, mesh: DeviceMesh) -> None:
            for name, parameter in list(owner.named_parameters(recurse=False)):
                owner.register_parameter(
                    name, nn.Parameter(distribute_tensor(parameter, mesh, [Shard(1)]), parameter.requires_grad)
                )

        return distribute_module(module, device_mesh, shard)


def _style(
    name: str, *, sequence_parallel: bool, reduce_dtype: torch.dtype | None, kv_replicator: int, head_dim: int | None
) -> ParallelStyle | None:
    activations = Shard(1) if sequence_parallel else Replicate()
    if name == "colwise_kv" and kv_replicator > 1:
        return ReplicatedKVParallel(kv_replicator, head_dim)
    if name == "qkv":
        return QKVParallel(kv_replicator, head_dim)
    if name in ("colwise", "colwise_kv"):
        return _ColwiseReducing(input_layouts=activations, reduce_dtype=reduce_dtype)
    if name == "colwise_output":
        return _ColwiseReducing(
            input_layouts=activations, output_layouts=Shard(-1), use_local_output=False, reduce_dtype=reduce_dtype
        )
    if name == "rowwise":
        return _RowwiseReducing(output_layouts=activations, reduce_dtype=reduce_dtype)
    if name == "score":
        return _RowwiseReducing(input_layouts=activations, output_layouts=Replicate(), reduce_dtype=reduce_dtype)
    if name == "vocab":
        return _RowwiseReducing(input_layouts=Replicate(), output_layouts=Replicate(), reduce_dtype=reduce_dtype)
    if name == "sequence":
        return SequenceParallel() if sequence_parallel else None
    if name == "heads":
        return _HeadColumns()
    if name == MOE_STYLE:  # split with the experts (`apply_expert_parallel`)
        return None
    if name == "replicated_with_grad_allreduce":
        return SequenceParallel(sequence_dim=2, use_local_output=True)
    if name in LOW_RANK_STYLES:
        return LowRankParallel(
            name, sequence_parallel=sequence_parallel, kv_replicator=kv_replicator, head_dim=head_dim
        )
    raise AssertionError(name)


def apply_tensor_parallel(
    model: nn.Module,
    plan: Mapping[str, str],
    mesh: DeviceMesh,
    *,
    sequence_parallel: bool = False,
    reduce_dtype: torch.dtype | None = None,
    kv_replicator: int = 1,
    head_dim: int | None = None,
) -> nn.Module:
    """Shard `model` in place over the 1-D tensor-parallel `mesh` as `plan` declares.

    With sequence parallelism, `enter_sequence_parallel` then marks where the input is split.
    `head_dim` is needed when `kv_replicator` > 1. Tied weights (an output layer sharing the
    embedding) stay tied.
    """
    problems = check_plan(model, plan)
    if kv_replicator > 1 and head_dim is None:
        problems.append("kv_replicator > 1 needs the head dimension of the key/value projections")
    if problems:
        raise ParallelConfigError(*problems)
    tied = tied_parameters(model)
    styles = {}
    for pattern, name in plan.items():
        style = _style(
            name,
            sequence_parallel=sequence_parallel,
            reduce_dtype=reduce_dtype,
            kv_replicator=kv_replicator,
            head_dim=head_dim,
        )
        if style is not None:
            styles[pattern] = style
    frozen = {name for name, parameter in model.named_parameters() if not parameter.requires_grad}
    parallelize_module(model, mesh, styles)
    retie(model, tied)
    for name, parameter in model.named_parameters():  # some styles make new parameters that require grad
        parameter.requires_grad_(name not in frozen)
    if sequence_parallel:
        names = [name for name, _ in model.named_modules()]
        blocks = {
            pattern.removesuffix(BASE_LAYER).rpartition(".")[0]
            for pattern, style in plan.items()
            if style in _GATHERED_ONCE
        }
        for block in {name for pattern in blocks for name in fnmatch.filter(names, pattern)}:
            model.get_submodule(block).register_forward_pre_hook(_gather_sequence_once(mesh), with_kwargs=True)
    return model


def enter_sequence_parallel(model: nn.Module, first_layer: str, mesh: DeviceMesh) -> None:
    """Split the whole hidden states entering `first_layer` (the first decoder layer of a model or of
    the first pipeline stage) along the sequence, for the tensor-parallel `mesh`.

    Call it after activation checkpointing is applied: the split then runs after the checkpoint has
    kept the layer's input, so a recomputation replays it from the whole input. Registered before, the
    checkpoint would keep the split input and its replay would split it a second time."""
    if first_layer not in dict(model.named_modules()):
        raise ParallelConfigError(
            f"sequence parallelism needs the first decoder layer; {first_layer!r} is no "
            f"module of {type(model).__name__}"
        )
    model.get_submodule(first_layer).register_forward_pre_hook(_scatter_sequence(mesh), with_kwargs=True)
