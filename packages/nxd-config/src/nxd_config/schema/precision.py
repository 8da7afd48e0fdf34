"""`precision`: the dtype policy of parameters, compute, gradients and optimizer state."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator

from ._base import Section, Status, key

PREC = "nxd-precision"

PrecisionType = Literal[
    "fp32", "bf16SR", "autocast", "mixed_precision", "mixed_precisionSR", "fp16", "fp16_autocast", "manual"
]


def _flag_to_str(value: Any) -> Any:
    """The runtime knobs are environment-variable strings ('0'/'1'); accept 0/1 integers too."""
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return str(value)
    return value


Flag = Annotated[Literal["0", "1"], BeforeValidator(_flag_to_str)]

MANUAL_KNOBS: dict[str, Any] = {
    "master_weights": False,
    "fp32_grad_acc": False,
    "fp32_grads_cc": False,
    "xla_use_bf16": "0",
    "xla_downcast_bf16": "0",
    "neuron_rt_stochastic_rounding_en": "0",
}
"""Keys read only with `type: manual`, with their defaults."""
LOSS_SCALING: dict[str, Any] = {
    "loss_scale": 0.0,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1.0,
    "consecutive_hysteresis": False,
}
"""Keys read only with `type: fp16`, with their defaults (DeepSpeed's)."""
_FP16 = "GPT-NeoX's (DeepSpeed's) fp16 block; NxDT has no fp16 type"


class Fp8Config(Section):
    """FP8 training through torchao's float8: the decoder layers' linear layers compute their matmuls on float8
    casts scaled from each operand's current absolute maximum; the weights keep the type's dtype."""

    recipe: Literal["tensorwise", "rowwise"] = key(
        "tensorwise",
        "tensorwise: one scale per tensor; rowwise: one per row (torchao's rowwise recipe, scales "
        "rounded to powers of 2).",
        by=PREC,
        status=Status.EXTENSION,
        note="torchao's float8 recipes",
    )
    format: Literal["hybrid", "e4m3"] | None = key(
        None,
        "hybrid: e4m3 inputs and weights, e5m2 output gradients; e4m3: every operand e4m3; null: the recipe's "
        "own (tensorwise hybrid, rowwise e4m3).",
        by=PREC,
        status=Status.EXTENSION,
        note="GPT-NeoX's te_fp8_format",
    )
    weight_gradient: bool = key(
        True,
        "The weight-gradient matmul in float8 too; false computes it from the operands' own precision.",
        by=PREC,
        status=Status.EXTENSION,
        note="GPT-NeoX's te_fp8_wgrad",
    )
    emulate: bool = key(
        False,
        "torchao's emulation: the float8 casts and scales with higher-precision matmuls, on any device "
        "(slower; for checking the numerics where no FP8 matmul exists).",
        by=PREC,
        status=Status.EXTENSION,
        note="torchao's emulate",
    )
    all_gather: bool = key(
        False,
        "With distributed_strategy.zero1 (and zero3): each layer's weights are gathered as float8 (cast on "
        "each rank with the scale of the whole weight's maximum) rather than in the parameters' dtype; a quarter of "
        "fp32's gather traffic, half of bf16's, and the same float8 weight. tensorwise only; not with tensor "
        "parallelism.",
        by=PREC,
        status=Status.EXTENSION,
        note="torchao's enable_fsdp_float8_all_gather",
    )


class PrecisionConfig(Section):
    type: PrecisionType = key(
        "mixed_precision",
        "fp32; mixed_precision (bf16 compute, fp32 master weights, fp32 grad accumulation and "
        "reduction); mixed_precisionSR (the same with stochastic rounding); bf16SR (all bf16, "
        "stochastically rounded updates); autocast (torch.autocast bf16); fp16 (an nxd extension value: fp16 "
        "parameters and compute, fp32 master weights, fp32 gradient accumulation and reduction, loss scaling by the "
        "keys below); fp16_autocast (an nxd extension value: fp32 parameters, fp16 compute by torch.autocast, loss "
        "scaling by the keys below; apex's O1); manual (the knobs below).",
        by=PREC,
        extension_values=("fp16", "fp16_autocast"),
    )
    master_weights: bool = key(False, "manual: keep fp32 master weights for bf16 parameters.", by=PREC)
    fp32_grad_acc: bool = key(False, "manual: accumulate gradients in fp32.", by=PREC)
    fp32_grads_cc: bool = key(False, "manual: reduce gradients across ranks in fp32.", by=PREC)
    xla_use_bf16: Flag = key("0", "manual: '1' keeps parameters and compute in bf16.", by=PREC)
    xla_downcast_bf16: Flag = key("0", "manual: '1' computes in bf16 over fp32 parameters (downcast copies).", by=PREC)
    neuron_rt_stochastic_rounding_en: Flag = key(
        "0", "manual: '1' applies bf16 updates with stochastic rounding.", by=PREC
    )
    fp32_matmul_precision: Literal["highest", "high", "medium"] = key(
        "highest",
        "How float32 matmuls run on CUDA (torch.set_float32_matmul_precision): highest in full fp32, high "
        "on TF32 tensor cores, medium in bf16. MFU is reported against the matching peak.",
        by="nxd-train",
        status=Status.EXTENSION,
        note="NxDT runs on Neuron devices; fp32 stays exact unless a run asks for TF32",
    )
    loss_scale: float = key(
        0.0,
        "fp16: a static loss scale; 0 scales dynamically, as the keys below say.",
        by=PREC,
        ge=0.0,
        status=Status.EXTENSION,
        note=_FP16,
    )
    initial_scale_power: int = key(
        16,
        "fp16, dynamic: the first scale is 2^initial_scale_power.",
        by=PREC,
        ge=0,
        le=100,
        status=Status.EXTENSION,
        note=_FP16,
    )
    loss_scale_window: int = key(
        1000,
        "fp16, dynamic: the scale doubles after this many steps without an overflow.",
        by=PREC,
        ge=1,
        status=Status.EXTENSION,
        note=_FP16,
    )
    hysteresis: int = key(
        2,
        "fp16, dynamic: overflows absorbed (each a skipped step) before the scale halves.",
        by=PREC,
        ge=1,
        status=Status.EXTENSION,
        note=_FP16,
    )
    min_loss_scale: float = key(
        1.0,
        "fp16, dynamic: the scale never drops below this; overflows at it count towards "
        "trainer.max_consecutive_nonfinite.",
        by=PREC,
        gt=0.0,
        status=Status.EXTENSION,
        note=_FP16,
    )
    consecutive_hysteresis: bool = key(
        False,
        "fp16, dynamic: restore the hysteresis after every step without an overflow (not only when the scale grows).",
        by=PREC,
        status=Status.EXTENSION,
        note=_FP16,
    )
    parallel_layers_reduce_dtype: Literal["bf16", "fp32"] | None = key(
        None,
        "Dtype of tensor-parallel all-reduce / reduce-scatter; null means fp32 for types fp32 and fp16, "
        "bf16 otherwise.",
        by="nxd-parallel",
    )
    fp8: Fp8Config | None = key(
        None,
        "FP8 training of the decoder layers' linear layers (see the fp8 keys; torchao's float8, pip install "
        "'nxd-train[fp8]'); null: none. Needs FP8 matmuls (CUDA compute capability 8.9 or newer, ROCm MI300) "
        "unless emulate. With tensor parallelism the swapped layers take nxd's own styles; each scale is still the "
        "whole tensor's (or row's).",
        by=PREC,
        status=Status.EXTENSION,
        note="GPT-NeoX's te_fp8_mha; NxDT has no such key",
    )
