"""FP8 training through torchao's float8 (`pip install nxd-precision[fp8]`): the decoder layers' linear layers
compute their three matmuls (output, input gradient, weight gradient) on float8 casts of their operands, each cast
scaled dynamically from its operand's current absolute maximum, per tensor (tensorwise) or per row (rowwise).

The weights stay in the policy's parameter dtype; only the matmuls' operands are float8, so checkpoints and exports
do not change. Devices without FP8 matmuls (torch._scaled_mm: CUDA compute capability 8.9 or newer, or ROCm's
MI300) are refused unless `emulate` asks for torchao's emulation: the same casts and scales with higher-precision
matmuls, to check the numerics anywhere.

Under tensor parallelism the swapped layers take nxd's own column- and row-parallel styles: torchao's casts read
DTensors, so each tensorwise scale comes from the whole tensor's maximum and each rowwise scale from its whole row,
as in one process. Where ZeRO shards the weights, `all_gather` makes FSDP2 gather each weight as float8 (torchao's
`enable_fsdp_float8_all_gather`): the rank casts its shard with the scale of the whole weight's maximum (one
all-reduce) before the gather, so the layer computes on the same float8 weight at a quarter of fp32's traffic.
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .errors import PrecisionConfigError

FP8_RECIPES = ("tensorwise", "rowwise")
FP8_FORMATS = ("hybrid", "e4m3")
"""hybrid: e4m3 for the inputs and weights, e5m2 for the output gradients (Transformer Engine's HYBRID); e4m3: every
operand e4m3."""
FLOAT8_MATMUL_MULTIPLE = 16
"""torch._scaled_mm needs both dimensions of a weight to be multiples of 16: other layers keep their precision."""
SKIPPED = ("lm_head", "router", "block_sparse_moe.gate", "mlp.gate", "score", "coefficient", "dt_proj")
"""Layers left out (name endings): the output layer, and the routers and PR-MoE's mix, whose logits float8 would
coarsen; a Mamba mixer's dt_proj, whose weight the mixer reads itself; LoRA's adapters (names holding `lora_`)
too."""


@dataclass(frozen=True)
class Float8Spec:
    """How the linear layers train in float8 (plain values; nxd-train fills them from `precision.fp8`)."""

    recipe: str = "tensorwise"
    format: str | None = None
    """None: the recipe's own (tensorwise: hybrid; rowwise: e4m3, as torchao's rowwise recipe)."""
    weight_gradient: bool = True
    """False: the weight-gradient matmul reads its operands in the parameters' precision."""
    emulate: bool = False
    all_gather: bool = False
    """Where FSDP2 shards the weights (ZeRO-1 or ZeRO-3), gather them as float8 rather than in their own dtype
    (tensorwise only)."""
    kept: tuple[str, ...] = ()
    """fnmatch patterns of module names that keep their precision (nxd-train: the key/value projections a
    kv_replicator replicates, which compute only their rank's head rows)."""


def float8_config(spec: Float8Spec) -> Any:
    """torchao's Float8LinearConfig for `spec`."""
    config, cast = _torchao()
    if spec.recipe not in FP8_RECIPES:
        raise PrecisionConfigError(
            f"precision.fp8.recipe: expected one of {', '.join(FP8_RECIPES)}, found {spec.recipe!r}"
        )
    if spec.format is not None and spec.format not in FP8_FORMATS:
        raise PrecisionConfigError(
            f"precision.fp8.format: expected one of {', '.join(FP8_FORMATS)}, found {spec.format!r}"
        )
    rowwise = spec.recipe == "rowwise"
    if rowwise and spec.all_gather:
        raise PrecisionConfigError(
            "precision.fp8.all_gather: torchao gathers float8 weights for tensorwise scaling "
            "only; expected precision.fp8.recipe tensorwise with it, found rowwise"
        )
    granularity = cast.ScalingGranularity.AXISWISE if rowwise else cast.ScalingGranularity.TENSORWISE
    grads = torch.float8_e4m3fn if (spec.format or ("e4m3" if rowwise else "hybrid")) == "e4m3" else torch.float8_e5m2
    operand = cast.CastConfig(scaling_granularity=granularity, target_dtype=torch.float8_e4m3fn)
    grad_output = cast.CastConfig(scaling_granularity=granularity, target_dtype=grads)
    kept = {}
    if not spec.weight_gradient:  # the weight gradient's matmul in high precision (torchao's "gw_hp")
        kept = {
            "cast_config_input_for_grad_weight": cast.CastConfig(
                scaling_type=cast.ScalingType.DISABLED, target_dtype=torch.float8_e4m3fn
            ),
            "cast_config_grad_output_for_grad_weight": cast.CastConfig(
                scaling_type=cast.ScalingType.DISABLED, target_dtype=grads
            ),
        }
    return config(
        cast_config_input=operand,
        cast_config_weight=operand,
        cast_config_grad_output=grad_output,
        round_scales_to_power_of_2=rowwise,
        emulate=spec.emulate,
        enable_fsdp_float8_all_gather=spec.all_gather,
        **kept,
    )


def use_float8(module: nn.Module, spec: Float8Spec) -> list[str]:
    """Swap `module`'s decoder-layer linear layers (their names and parameters unchanged) for torchao's Float8Linear;
    the names of those swapped. Layers whose sizes are not multiples of 16, the output layer and routers stay."""
    _torchao()
    from torchao.float8 import convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    swapped: list[str] = []

    def chosen(layer: nn.Module, name: str) -> bool:
        if not isinstance(layer, nn.Linear) or isinstance(layer, Float8Linear):
            return False
        sized = not layer.in_features % FLOAT8_MATMUL_MULTIPLE and not layer.out_features % FLOAT8_MATMUL_MULTIPLE
        wanted = (
            ".layers." in f".{name}"
            and not name.endswith(SKIPPED)
            and "lora_" not in name
            and sized
            and not any(fnmatch.fnmatchcase(name, pattern) for pattern in spec.kept)
        )
        if wanted:
            swapped.append(name)
        return wanted

    convert_to_float8_training(module, config=float8_config(spec), module_filter_fn=chosen)
    return swapped


def float8_coverage(module: nn.Module, spec: Float8Spec) -> tuple[list[str], dict[str, int]]:
    """What `use_float8` does to `module` (a meta tree, which it converts): the layers it swaps, and per class name how
    many decoder-layer modules holding matrices of their own keep their precision (fused QKV modules, stacked experts,
    layers too narrow for float8 matmuls, routers)."""
    swapped = use_float8(module, spec)
    from torchao.float8.float8_linear import Float8Linear

    kept: dict[str, int] = {}
    for name, layer in module.named_modules():
        if (
            ".layers." in f".{name}"
            and not isinstance(layer, Float8Linear)
            and "lora_" not in name
            and any(p.dim() > 1 for p in layer.parameters(recurse=False))
        ):
            kept[type(layer).__name__] = kept.get(type(layer).__name__, 0) + 1
    return swapped, kept


def float8_support_problem(spec: Float8Spec, device: torch.device) -> str | None:
    """Why `device` cannot train in float8 as `spec` asks, or None."""
    try:
        _torchao()
    except PrecisionConfigError as error:
        return str(error)
    if spec.emulate:
        return None
    if device.type == "cuda" and torch.cuda.is_available():
        if torch.version.hip or torch.cuda.get_device_capability(device) >= (8, 9):
            return None
        found = f"compute capability {'.'.join(map(str, torch.cuda.get_device_capability(device)))}"
    else:
        found = f"the {device.type} device"
    return (
        f"precision.fp8: float8 matmuls (torch._scaled_mm) need a GPU of CUDA compute capability 8.9 or newer "
        f"(Ada, Hopper, Blackwell) or ROCm's MI300, found {found}; set precision.fp8.emulate: true to train with "
        "torchao's emulation (float8 numerics, higher-precision matmuls: slower, for checking), or remove "
        "precision.fp8"
    )


def _torchao() -> tuple[Any, Any]:
    """torchao's float8 config module, imported without the deprecation notice torch's pytree logs for it."""
    quiet = logging.getLogger("torch.utils._pytree")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        from torchao.float8 import config as cast
        from torchao.float8.config import Float8LinearConfig
    except ImportError:
        raise PrecisionConfigError(
            "precision.fp8: needs torchao's float8; install it with pip install "
            "'nxd-precision[fp8]' (or 'nxd-train[fp8]')"
        ) from None
    finally:
        quiet.setLevel(level)
    return Float8LinearConfig, cast
