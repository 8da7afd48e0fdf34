"""A model family turned into this rank's sharded model, as a `Layout` says.

The order is torchtitan's: build on the meta device, cut this rank's pipeline stages out of it,
tensor/sequence parallel, context parallel, activation checkpointing, data parallel (FSDP2 sharding
for zero1, replication otherwise, over the data x context ranks), then materialise every rank's
shards from the same seeded initialisation a single process would make.

nxd-parallel imports no model code: a family hands it what it needs through `ShardableModel`
(nxd-models' `ModelFamily` is one).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from .activation_checkpointing import apply_activation_checkpointing
from .compile import compile_blocks
from .context_parallel import ring_attention
from .dims import ParallelMesh
from .errors import ParallelConfigError
from .pipeline import rank_stages, stage_ranges

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from .materialise import InitialValues

LAYER_PREFIX = "model.layers."
FIRST_LAYER = f"{LAYER_PREFIX}0"
"""Model families name their decoder layers model.layers.N."""


class ShardableModel(Protocol):
    """What nxd-parallel needs of a model family."""

    @property
    def head_dim(self) -> int: ...

    def build_on_meta(self) -> nn.Module: ...

    def initial_values(
        self, *, seed: int, device: torch.device, names: Collection[str] | None = None
    ) -> Iterable[tuple[str, torch.Tensor]]: ...

    def tp_plan(self) -> dict[str, str]: ...

    def decoder_layers(self, model: nn.Module) -> list[nn.Module]: ...

    def recompute_units(self, model: nn.Module, names: Iterable[str], include_mlp: bool) -> list[nn.Module]: ...

    def keep_pipeline_stage(self, model: nn.Module, layers: range, *, first: bool, last: bool) -> nn.Module: ...

    def stage_costs(self, model: nn.Module) -> tuple[int, int, int]: ...

    def use_context_parallel(self, model: nn.Module, attention: Callable[..., torch.Tensor]) -> None: ...


PrepareParameters = Callable[..., None]
"""`prepare(module, cast=...)`: hold the parameters in their training dtypes (nxd-precision's
`prepare_parameters` with its policy bound): with cast=False only the gradient dtypes are set again."""


@dataclass(frozen=True)
class Layout:
    """How the model is split and recomputed (plain values from the config)."""

    sequence_parallel: bool = False
    zero1: bool = False
    zero3: bool = False
    """With zero1: decoder layers free their gathered parameters after the forward (ZeRO-3)."""
    cpu_offload: bool = False
    """With zero1: the shards of parameters, gradients and optimizer state live in host memory."""
    kv_replicator: int = 1
    recompute: str | None = None
    """"full" (whole layers), "selective" (`recompute_modules`) or None."""
    recompute_modules: tuple[str, ...] = ()
    recompute_mlp: bool = False
    reduce_dtype: torch.dtype | None = None
    """Dtype of the tensor-parallel reductions; None keeps the activations' dtype."""
    grad_reduce_dtype: torch.dtype | None = None
    """Dtype of the data-parallel gradient reduction; None keeps the gradients' dtype."""
    ranks_at_once: int = 11
    virtual_stages: int = 1
    """Pipeline stages per pipeline rank (interleaved 1F1B above 1)."""
    pipeline_cuts: tuple[str, ...] | None = None
    """The layer (model.layers.N) that ends each stage but the last; None balances the stages."""
    compile_blocks: bool = False
    """torch.compile each decoder layer (after TP and recompute wrapping, before data parallelism)."""


def recompute_units(family: ShardableModel, model: nn.Module, layout: Layout) -> list[nn.Module]:
    """The modules whose activations `layout` recomputes in backward (whole layers for "full")."""
    if layout.recompute == "full":
        return family.decoder_layers(model)
    if layout.recompute != "selective":
        return []
    return family.recompute_units(model, layout.recompute_modules, layout.recompute_mlp)


class StagedModel:
    """The pipeline stages one rank holds, read as one model: parameters and state under their
    whole-model names (the stages' names never overlap), train/eval for all of them."""

    def __init__(self, stages: list[nn.Module], numbers: list[int], num_stages: int):
        self.stages, self.numbers, self.num_stages = stages, numbers, num_stages

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        for stage in self.stages:
            yield from stage.named_parameters()

    def parameters(self) -> Iterator[nn.Parameter]:
        return (parameter for _, parameter in self.named_parameters())

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {key: value for stage in self.stages for key, value in stage.state_dict().items()}

    def train(self, mode: bool = True) -> StagedModel:
        for stage in self.stages:
            stage.train(mode)
        return self

    def eval(self) -> StagedModel:
        return self.train(False)


def modules_of(model: nn.Module | StagedModel) -> list[nn.Module]:
    """The modules a rank holds: the model, or its pipeline stages."""
    return model.stages if isinstance(model, StagedModel) else [model]


def pipeline_ranges(family: ShardableModel, model: nn.Module, layout: Layout, pp: int) -> list[range]:
    """The decoder layers of every pipeline stage (pp x virtual stages) of `model` (whole, on the meta
    device): at `layout.pipeline_cuts`, or balanced by parameter count with the embeddings on the
    first stage and the output layer (and final norm) on the last."""
    layers = family.decoder_layers(model)
    cuts, key = None, "distributed_strategy.pipeline_model_parallel_size"
    if layout.pipeline_cuts is not None:
        key, numbers = "model.pipeline_cuts", {f"{LAYER_PREFIX}{index}": index for index in range(len(layers))}
        if unknown := [name for name in layout.pipeline_cuts if name not in numbers]:
            raise ParallelConfigError(
                f"{key}: {', '.join(map(repr, unknown))} names no decoder layer; expected "
                f"{LAYER_PREFIX}0 to {LAYER_PREFIX}{len(layers) - 1}"
            )
        cuts = [numbers[name] for name in layout.pipeline_cuts]
    layer_cost, first_cost, last_cost = family.stage_costs(model)
    try:
        return stage_ranges(
            len(layers),
            pp * layout.virtual_stages,
            cuts=cuts,
            layer_cost=layer_cost,
            first_cost=first_cost,
            last_cost=last_cost,
        )
    except ParallelConfigError as error:
        raise ParallelConfigError(*(f"{key}: {problem}" for problem in error.problems)) from None


def build_parallel_model(
    family: ShardableModel,
    layout: Layout,
    mesh: ParallelMesh,
    device: torch.device,
    *,
    seed: int,
    use_cpu_initialization: bool = True,
    prepare: PrepareParameters | None = None,
    loaded: Collection[str] = (),
) -> nn.Module | StagedModel:
    """The model, sharded over `mesh` as `layout` says (with pipeline parallelism: this rank's stages);
    its values are those `family.build(seed=seed)` makes in one process, with the parameter dtypes
    `prepare` sets (fp32 when None). No rank holds more than its shards and one module of the whole.
    `loaded` names the tensors (whole-model state-dict names) the caller fills next from initial
    weights: they are allocated, not initialised.
    The torch RNG is left seeded with `seed` on every rank, whatever building the mesh and the model
    drew, so that the random streams after it (dropout) start alike in every layout."""
    prepare = prepare or _keep_dtypes
    init_device = torch.device("cpu") if use_cpu_initialization else device

    def whole(names: Collection[str]) -> Iterable[tuple[str, torch.Tensor]]:
        return family.initial_values(seed=seed, device=init_device, names=names)

    materialised = partial(_materialised, values=whole, device=device, layout=layout, prepare=prepare, loaded=loaded)
    shard = partial(_shard, family=family, layout=layout, mesh=mesh, prepare=prepare)
    pp = mesh.get("pp")
    if pp is None:
        model = materialised(shard(family.build_on_meta(), first_layer=FIRST_LAYER))
    else:
        ranges = pipeline_ranges(family, family.build_on_meta(), layout, pp.size())
        numbers = rank_stages(pp.get_local_rank(), pp.size(), layout.virtual_stages)
        stages = []
        for number in numbers:
            stage = family.keep_pipeline_stage(
                family.build_on_meta(), ranges[number], first=number == 0, last=number == len(ranges) - 1
            )
            stages.append(materialised(shard(stage, first_layer=FIRST_LAYER if number == 0 else None)))
        model = StagedModel(stages, numbers, len(ranges))
    torch.manual_seed(seed)
    return model


def _keep_dtypes(module: nn.Module, cast: bool = True) -> None:
    """No precision policy: parameters stay as built."""


def _shard(
    model: nn.Module,
    *,
    family: ShardableModel,
    layout: Layout,
    mesh: ParallelMesh,
    prepare: PrepareParameters,
    first_layer: str | None,
) -> nn.Module:
    """Tensor/sequence, context and data parallelism and recomputation, applied to a meta-device model
    (or pipeline stage); `first_layer` is where its input enters the sequence-parallel region."""
    # DTensor's and FSDP's modules load here, when a model is sharded, not with the layout a config check reads
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from .data_parallel import apply_data_parallel
    from .expert_parallel import apply_expert_parallel, moe_modules
    from .tensor_parallel import enter_sequence_parallel

    tp, cp, data = mesh.get("tp"), mesh.get("cp"), mesh.get("dp_cp")
    prepare(model, cast=True)
    plan = shard_tensor_parallel(model, family, layout, tp, prepare, sequence_parallel=layout.sequence_parallel)
    moe = moe_modules(model, plan) if mesh.experts() is not None else []
    if moe:
        apply_expert_parallel(
            moe, mesh.experts(), sequence_parallel=layout.sequence_parallel, reduce_dtype=layout.reduce_dtype
        )
        prepare(model, cast=False)
    if cp is not None:
        family.use_context_parallel(model, partial(ring_attention, group=cp.get_group()))
    apply_activation_checkpointing(recompute_units(family, model, layout))
    if tp is not None and layout.sequence_parallel and first_layer is not None:
        enter_sequence_parallel(model, first_layer, tp)  # after the checkpoints: a recompute must not split twice
    if layout.compile_blocks:
        compile_blocks(family.decoder_layers(model))
    if data is not None:  # context-parallel ranks hold the same weights: their gradients are reduced too
        apply_data_parallel(
            model,
            data,
            zero1=layout.zero1,
            zero3=layout.zero3,
            cpu_offload=layout.cpu_offload,
            blocks=family.decoder_layers(model),
            mp_policy=MixedPrecisionPolicy(reduce_dtype=layout.grad_reduce_dtype),
            experts=[layer.experts for layer in moe] if mesh.get("ep") is not None else (),
            experts_mesh=mesh.get("edp"),
        )
    return model


def shard_tensor_parallel(
    model: nn.Module,
    family: ShardableModel,
    layout: Layout,
    tp: DeviceMesh | None,
    prepare: PrepareParameters,
    *,
    sequence_parallel: bool,
) -> dict[str, str]:
    """`family`'s tensor-parallel plan, the entries that name modules of `model` (a pipeline stage lacks the other
    stages' parts), applied over `tp` where there is one."""
    from .tensor_parallel import apply_tensor_parallel

    names = [name for name, _ in model.named_modules()]
    plan = {pattern: style for pattern, style in family.tp_plan().items() if fnmatch.filter(names, pattern)}
    if tp is not None:
        apply_tensor_parallel(
            model,
            plan,
            tp,
            sequence_parallel=sequence_parallel,
            reduce_dtype=layout.reduce_dtype,
            kv_replicator=layout.kv_replicator,
            head_dim=family.head_dim,
        )
        prepare(model, cast=False)  # the TP parameters are new objects
    return plan


def _materialised(
    model: nn.Module,
    *,
    values: InitialValues,
    device: torch.device,
    layout: Layout,
    prepare: PrepareParameters,
    loaded: Collection[str],
) -> nn.Module:
    from .materialise import materialise

    materialise(model, values, device, ranks_at_once=layout.ranks_at_once, loaded=loaded)
    prepare(model, cast=False)  # allocation swaps DTensor parameters, dropping their grad_dtype
    return model


def tensor_parallel_problems(sizes: dict[str, int], source: str, tp: int, kv_replicator: int) -> list[str]:
    """Why the sizes a family splits (`ModelFamily.sharded_sizes`: query heads first, then KV heads)
    do not divide over `tp` ranks with `kv_replicator` copies of each KV head."""
    if tp == 1:
        return []
    heads, kv_name = list(sizes)[:2]
    kv_copies = sizes[kv_name] * kv_replicator
    problems = [
        f"{source}: {name}: expected a multiple of tensor_model_parallel_size ({tp}), found {size}"
        for name, size in sizes.items()
        if name != kv_name and size % tp
    ]
    if kv_copies % tp:
        problems.append(
            f"distributed_strategy.kv_replicator: {sizes[kv_name]} KV heads x {kv_replicator} "
            f"= {kv_copies}; expected a multiple of tensor_model_parallel_size ({tp})"
        )
    elif sizes[heads] % kv_copies:
        problems.append(
            f"distributed_strategy.kv_replicator: {sizes[kv_name]} KV heads x {kv_replicator} "
            f"= {kv_copies}; expected a divisor of {heads} ({sizes[heads]})"
        )
    return problems
