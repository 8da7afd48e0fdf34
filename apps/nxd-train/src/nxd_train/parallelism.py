"""`distributed_strategy` and the activation-checkpointing keys, turned into a sharded model.

The order is torchtitan's: build on the meta device, cut this rank's pipeline stages out of it,
tensor/sequence parallel, context parallel, activation checkpointing, data parallel (FSDP2 sharding
for zero1, replication otherwise, over the data x context ranks), then materialise every rank's
shards from the same seeded initialisation a single process would make.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import torch
from nxd_config import NxdConfig
from nxd_models import (
    AttentionKernel,
    GPTConfig,
    ModelConfigError,
    build_causal_lm,
    build_on_meta,
    decoder_layers,
    gpt_tp_plan,
    hf_tp_plan,
    keep_pipeline_stage,
    pipeline_stage_problems,
    recompute_core_attention,
    use_context_parallel,
)
from nxd_parallel import (
    ParallelConfigError,
    ParallelMesh,
    apply_activation_checkpointing,
    apply_data_parallel,
    apply_tensor_parallel,
    check_plan,
    materialise,
    modules_of_classes,
    rank_stages,
    ring_attention,
    stage_ranges,
)
from nxd_precision import PrecisionPolicy, prepare_parameters, resolve_policy
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from transformers import PretrainedConfig, PreTrainedModel

FP32_POLICY = resolve_policy("fp32")
LAYER_PREFIX = "model.layers."
FIRST_LAYER = f"{LAYER_PREFIX}0"
"""Both model families name their decoder layers model.layers.N."""


@dataclass(frozen=True)
class Layout:
    """How the model is split and recomputed (plain values from the config)."""

    sequence_parallel: bool = False
    zero1: bool = False
    kv_replicator: int = 1
    recompute: str | None = None
    """"full" (whole layers), "selective" (`recompute_modules`) or None."""
    recompute_modules: tuple[str, ...] = ()
    recompute_mlp: bool = False
    reduce_dtype: torch.dtype | None = None
    """Dtype of the tensor-parallel reductions; None keeps the activations' dtype."""
    ranks_at_once: int = 11
    virtual_stages: int = 1
    """Pipeline stages per pipeline rank (interleaved 1F1B above 1)."""
    pipeline_cuts: tuple[str, ...] | None = None
    """The layer (model.layers.N) that ends each stage but the last; None balances the stages."""

    @classmethod
    def from_config(cls, cfg: NxdConfig, policy: PrecisionPolicy) -> Layout:
        """The layout the config asks for; tensor-parallel reductions follow the precision policy (a
        reduction in the activations' own dtype needs no cast)."""
        ds, m, reduce = cfg.distributed_strategy, cfg.model, policy.parallel_layers_reduce_dtype
        return cls(
            sequence_parallel=ds.sequence_parallel and ds.tensor_model_parallel_size > 1, zero1=ds.zero1,
            kv_replicator=ds.kv_replicator, recompute=m.activations_checkpoint_granularity,
            recompute_modules=tuple(m.activations_checkpoint_recompute or ()),
            recompute_mlp=m.activations_checkpoint_recompute_mlp,
            reduce_dtype=None if reduce == policy.compute_dtype else reduce,
            ranks_at_once=cfg.trainer.sequential_move_factor,
            virtual_stages=ds.virtual_pipeline_model_parallel_size or 1,
            pipeline_cuts=None if m.pipeline_cuts is None else tuple(m.pipeline_cuts),
        )  # fmt: skip


def tp_plan(spec: GPTConfig | PretrainedConfig) -> dict[str, str]:
    """The model family's declared TP plan."""
    return gpt_tp_plan(spec) if isinstance(spec, GPTConfig) else hf_tp_plan(spec)


def head_dim(spec: GPTConfig | PretrainedConfig) -> int:
    if isinstance(spec, GPTConfig):
        return spec.head_dim
    return getattr(spec, "head_dim", None) or spec.hidden_size // spec.num_attention_heads


def _recomputation(model: nn.Module, layout: Layout) -> tuple[list[nn.Module], bool]:
    """The modules to checkpoint, and whether a transformers model's attention core (a function,
    not a module) is recomputed too."""
    layers = decoder_layers(model)
    if layout.recompute == "full":
        return layers, False
    if layout.recompute != "selective":
        return [], False
    names = set(layout.recompute_modules)
    hf_core = isinstance(model, PreTrainedModel) and "CoreAttention" in names
    modules, missing = modules_of_classes(model, names - {"CoreAttention"} if hf_core else names)
    if missing:
        raise ParallelConfigError(
            f"model.activations_checkpoint_recompute: {', '.join(missing)} names no module of "
            f"{type(model).__name__}; expected class names such as CoreAttention"
        )
    if layout.recompute_mlp:
        modules += [layer.mlp for layer in layers if layer.mlp not in modules]
    return modules, hf_core


def _apply_recomputation(model: nn.Module, layout: Layout) -> None:
    modules, hf_core = _recomputation(model, layout)
    if hf_core:
        recompute_core_attention(model)
    apply_activation_checkpointing(modules)


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


def pipeline_ranges(model: nn.Module, layout: Layout, pp: int) -> list[range]:
    """The decoder layers of every pipeline stage (pp x virtual stages) of `model` (whole, on the meta
    device): at `layout.pipeline_cuts`, or balanced by parameter count with the embeddings on the
    first stage and the output layer (and final norm) on the last."""
    layers = decoder_layers(model)

    def size(module: nn.Module | None) -> int:
        return 0 if module is None else sum(p.numel() for p in module.parameters())

    first = size(model.model.embed_tokens) + size(getattr(model.model, "position_embeddings", None))
    cuts, key = None, "distributed_strategy.pipeline_model_parallel_size"
    if layout.pipeline_cuts is not None:
        key, numbers = "model.pipeline_cuts", {f"{LAYER_PREFIX}{index}": index for index in range(len(layers))}
        if unknown := [name for name in layout.pipeline_cuts if name not in numbers]:
            raise ParallelConfigError(f"{key}: {', '.join(map(repr, unknown))} names no decoder layer; expected "
                                      f"{LAYER_PREFIX}0 to {LAYER_PREFIX}{len(layers) - 1}")  # fmt: skip
        cuts = [numbers[name] for name in layout.pipeline_cuts]
    try:
        return stage_ranges(len(layers), pp * layout.virtual_stages, cuts=cuts, layer_cost=size(layers[0]),
                            first_cost=first, last_cost=size(model.lm_head) + size(model.model.norm))  # fmt: skip
    except ParallelConfigError as error:
        raise ParallelConfigError(*(f"{key}: {problem}" for problem in error.problems)) from None


def build_parallel_model(
    spec: GPTConfig | PretrainedConfig,
    attention: AttentionKernel,
    layout: Layout,
    mesh: ParallelMesh,
    device: torch.device,
    *,
    seed: int,
    use_cpu_initialization: bool = True,
    policy: PrecisionPolicy = FP32_POLICY,
) -> nn.Module | StagedModel:
    """The model, sharded over `mesh` as `layout` says (with pipeline parallelism: this rank's stages);
    its values are those `build_causal_lm` makes after `torch.manual_seed(seed)` in one process, held
    in the policy's parameter dtype, with gradients accumulated and reduced over data-parallel ranks
    in the policy's dtypes."""

    def whole() -> nn.Module:
        torch.manual_seed(seed)
        return build_causal_lm(spec, device, use_cpu_initialization=use_cpu_initialization, attention=attention)

    if all(mesh.get(name) is None for name in ("pp", "tp", "dp_cp")):
        model = whole()
        prepare_parameters(model, policy)
        _apply_recomputation(model, layout)
        return model
    shard = partial(_shard, spec=spec, layout=layout, mesh=mesh, policy=policy)
    pp = mesh.get("pp")
    if pp is None:
        model = shard(build_on_meta(spec, attention), first_layer=FIRST_LAYER)
        return _materialised(model, whole, device, layout, policy)
    ranges = pipeline_ranges(build_on_meta(spec, attention), layout, pp.size())
    numbers = rank_stages(pp.get_local_rank(), pp.size(), layout.virtual_stages)
    stages = []
    for number in numbers:
        stage = keep_pipeline_stage(build_on_meta(spec, attention), ranges[number], first=number == 0,
                                    last=number == len(ranges) - 1)  # fmt: skip
        stage = shard(stage, first_layer=FIRST_LAYER if number == 0 else None)
        stages.append(_materialised(stage, whole, device, layout, policy))
    return StagedModel(stages, numbers, len(ranges))


def _shard(model: nn.Module, *, spec: GPTConfig | PretrainedConfig, layout: Layout, mesh: ParallelMesh,
           policy: PrecisionPolicy, first_layer: str | None) -> nn.Module:  # fmt: skip
    """Tensor/sequence, context and data parallelism and recomputation, applied to a meta-device model
    (or pipeline stage); `first_layer` is where its input enters the sequence-parallel region."""
    tp, cp, data = mesh.get("tp"), mesh.get("cp"), mesh.get("dp_cp")
    prepare_parameters(model, policy)
    if tp is not None:
        names = [name for name, _ in model.named_modules()]  # a pipeline stage lacks the other stages' parts
        plan = {pattern: style for pattern, style in tp_plan(spec).items() if fnmatch.filter(names, pattern)}
        apply_tensor_parallel(model, plan, tp, sequence_parallel=layout.sequence_parallel,
                              first_layer=first_layer, reduce_dtype=layout.reduce_dtype,
                              kv_replicator=layout.kv_replicator, head_dim=head_dim(spec))  # fmt: skip
        prepare_parameters(model, policy, cast=False)  # the TP parameters are new objects
    if cp is not None:
        use_context_parallel(model, partial(ring_attention, group=cp.get_group()))
    _apply_recomputation(model, layout)
    if data is not None:  # context-parallel ranks hold the same weights: their gradients are reduced too
        apply_data_parallel(model, data, zero1=layout.zero1, blocks=decoder_layers(model),
                            mp_policy=MixedPrecisionPolicy(reduce_dtype=policy.grad_reduction_dtype))  # fmt: skip
    return model


def _materialised(model: nn.Module, whole: Callable[[], nn.Module], device: torch.device, layout: Layout,
                  policy: PrecisionPolicy) -> nn.Module:  # fmt: skip
    materialise(model, whole, device, ranks_at_once=layout.ranks_at_once)
    prepare_parameters(model, policy, cast=False)  # allocation swaps DTensor parameters, dropping their grad_dtype
    return model


def _shape(spec: GPTConfig | PretrainedConfig) -> dict[str, int]:
    """The sizes tensor parallelism splits, under the names a user looks for."""
    if isinstance(spec, GPTConfig):
        return {"num_attention_heads": spec.num_attention_heads, "num_kv_heads": spec.kv_heads,
                "ffn_hidden_size": spec.ffn_size, "vocab_size (padded)": spec.padded_vocab_size}  # fmt: skip
    return {"num_attention_heads": spec.num_attention_heads,
            "num_key_value_heads": spec.num_key_value_heads or spec.num_attention_heads,
            "intermediate_size": spec.intermediate_size, "vocab_size": spec.vocab_size}  # fmt: skip


def plan_problems(
    spec: GPTConfig | PretrainedConfig, attention: AttentionKernel, layout: Layout, tp: int, pp: int = 1, cp: int = 1
) -> list[str]:
    """What would stop the model from being sharded over `tp` ranks, cut into `pp` x virtual pipeline
    stages, split over `cp` context ranks or recomputed as `layout` says, checked on a meta-device
    build before any process starts."""
    source = "model" if isinstance(spec, GPTConfig) else "model.model_config"
    shape = _shape(spec)
    heads, kv_name = list(shape)[:2]  # the query-head and KV-head entries come first
    problems = []
    if tp > 1:
        kv_copies = shape[kv_name] * layout.kv_replicator
        problems += [f"{source}: {name}: expected a multiple of tensor_model_parallel_size ({tp}), found {size}"
                     for name, size in shape.items() if name != kv_name and size % tp]  # fmt: skip
        if kv_copies % tp:
            problems.append(f"distributed_strategy.kv_replicator: {shape[kv_name]} KV heads x {layout.kv_replicator} "
                            f"= {kv_copies}; expected a multiple of tensor_model_parallel_size ({tp})")  # fmt: skip
        elif shape[heads] % kv_copies:
            problems.append(f"distributed_strategy.kv_replicator: {shape[kv_name]} KV heads x {layout.kv_replicator} "
                            f"= {kv_copies}; expected a divisor of {heads} ({shape[heads]})")  # fmt: skip
    model = build_on_meta(spec, attention)
    problems += check_plan(model, tp_plan(spec))
    try:
        _recomputation(model, layout)
    except ParallelConfigError as error:
        problems += error.problems
    if pp > 1:
        stage_problems = pipeline_stage_problems(model)
        problems += stage_problems
        try:
            if not stage_problems:  # the stage counts matter only for a model that can be cut
                pipeline_ranges(model, layout, pp)
        except ParallelConfigError as error:
            problems += error.problems
    if cp > 1:
        try:
            use_context_parallel(model, lambda *_: None)  # last: it points the attention elsewhere
        except ModelConfigError as error:
            problems += error.problems
    return problems
