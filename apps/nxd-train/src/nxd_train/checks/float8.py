"""Float8 training's checks: which linear layers take float8 under the run's layout, and what gloo cannot gather."""

from __future__ import annotations

import fnmatch
import warnings
from dataclasses import replace

import torch
from nxd_align import LoraFamily
from nxd_config import ConfigNotice
from nxd_models import ModelFamily
from nxd_precision import FLOAT8_MATMUL_MULTIPLE, Float8Spec, float8_coverage


def float8_spec(family: ModelFamily | LoraFamily, spec: Float8Spec, kv_replicator: int) -> Float8Spec:
    """`spec` with the key/value projections a kv_replicator replicates kept in their precision: each rank computes
    only its head rows of them, outside the float8 layer."""
    if kv_replicator == 1:
        return spec
    return replace(spec, kept=tuple(pattern for pattern, style in family.tp_plan().items() if style == "colwise_kv"))


def float8_problems(family: ModelFamily | LoraFamily, spec: Float8Spec, device: torch.device, tp: int) -> list[str]:
    """A model with no decoder layer float8 can take is refused, as is a layer whose tensor-parallel part is not a
    multiple of 16 and, on gloo, a float8 gather of a layer holding float8 weights alone; one where some layers keep
    their precision is noticed."""
    model = family.build_on_meta()
    swapped, kept = float8_coverage(model, spec)
    if tp > 1 and (problem := _float8_split_problem(family, model, swapped, tp)):
        return [problem]
    if spec.all_gather and device.type == "cpu" and (alone := _float8_only_layer(family, model, swapped)):
        return [
            f"precision.fp8.all_gather: gloo, the CPU's collectives, cannot gather float8 tensors, and decoder "
            f"layer {alone} holds no other parameter (FSDP2 gathers a layer of several dtypes as bytes, which "
            f"gloo can); expected a GPU (NCCL) or all_gather false"
        ]
    if not swapped:
        return [
            f"precision.fp8: no linear layer of the decoder layers can compute in float8 (torch._scaled_mm needs "
            f"both sizes multiples of 16; fused QKV modules and stacked experts are not linear layers), found "
            f"{', '.join(f'{count} {kind}' for kind, count in kept.items()) or 'none'}; remove precision.fp8"
        ]
    if kept:
        warnings.warn(
            f"precision.fp8: {len(swapped)} linear layers compute in float8; kept in the parameters' "
            f"precision: {', '.join(f'{count} {kind}' for kind, count in kept.items())} (fused QKV modules, "
            "stacked experts, routers, key/value projections a kv_replicator replicates and layers whose "
            "sizes are not multiples of 16)",
            ConfigNotice,
            stacklevel=2,
        )
    return []


def _float8_split_problem(
    family: ModelFamily | LoraFamily, model: torch.nn.Module, swapped: list[str], tp: int
) -> str | None:
    """The first float8 layer whose part on a tensor-parallel rank torch._scaled_mm cannot take, or None."""
    split = {"colwise": "out_features", "colwise_kv": "out_features", "rowwise": "in_features"}
    plan = family.tp_plan()
    for name in swapped:
        styles = [style for pattern, style in plan.items() if fnmatch.fnmatchcase(name, pattern) and style in split]
        if styles and (size := getattr(model.get_submodule(name), split[styles[0]])) % (FLOAT8_MATMUL_MULTIPLE * tp):
            return (
                f"precision.fp8: under tensor parallelism each rank runs {name}'s float8 matmul on its part of "
                f"{split[styles[0]]} ({size} / {tp}), which torch._scaled_mm needs to be a multiple of "
                f"{FLOAT8_MATMUL_MULTIPLE}; expected a distributed_strategy.tensor_model_parallel_size that "
                f"leaves it so, found {tp}"
            )
    return None


def _float8_only_layer(family: ModelFamily | LoraFamily, model: torch.nn.Module, swapped: list[str]) -> str | None:
    """The first decoder layer of `model` (a meta tree) whose parameters are all float8 layers' weights (torchao
    wraps the weight only; a bias keeps its dtype), or None."""
    names = {id(module): name for name, module in model.named_modules()}
    weights = {f"{name}.weight" for name in swapped}
    for layer in family.decoder_layers(model):
        prefix = names[id(layer)]
        held = {f"{prefix}.{name}" for name, _ in layer.named_parameters()}
        if held and held <= weights:
            return prefix
    return None
