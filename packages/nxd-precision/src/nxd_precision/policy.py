"""What each `precision.type` means, as dtypes: one PrecisionPolicy resolved from the config's knobs.

The types follow the NxDT reference, spelled out for any device:

| type              | parameters | compute | master | grad accumulation | grad reduction | stochastic rounding |
|-------------------|------------|---------|--------|-------------------|----------------|---------------------|
| fp32              | fp32       | fp32    | -      | fp32              | fp32           | off                 |
| autocast          | fp32       | bf16 (torch.autocast) | - | fp32          | fp32           | off                 |
| mixed_precision   | bf16       | bf16    | fp32   | fp32              | fp32           | off                 |
| mixed_precisionSR | bf16       | bf16    | fp32   | fp32              | fp32           | on (bf16 copies)    |
| bf16SR            | bf16       | bf16    | -      | bf16              | bf16           | on (updates)        |
| fp16              | fp16       | fp16    | fp32   | fp32              | fp32           | off (loss scaling)  |
| fp16_autocast     | fp32       | fp16 (torch.autocast) | - | fp32          | fp32           | off (loss scaling)  |
| manual            | the knobs: xla_use_bf16 (bf16 parameters), xla_downcast_bf16 (bf16 compute over fp32
                      parameters), master_weights, fp32_grad_acc, fp32_grads_cc, neuron_rt_stochastic_rounding_en |

Optimizer state follows the dtype the optimizer steps on: the fp32 masters when there are some, else
the parameters, and fp32 whenever the optimizer asks for it (`adamw_fp32OptState`).
`parallel_layers_reduce_dtype` defaults to fp32 for fp32 and fp16 (whose range a reduction in it could
exceed), and to bf16 for every other type. fp16 and fp16_autocast (nxd extension types; the latter is apex's O1)
need loss scaling (`loss_scaling`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import PrecisionConfigError
from .float8 import Float8Spec

TYPES = ("fp32", "autocast", "mixed_precision", "mixed_precisionSR", "bf16SR", "fp16", "fp16_autocast", "manual")
LOSS_SCALED = ("fp16", "fp16_autocast")
"""The types whose fp16 compute needs loss scaling."""
FP32, BF16, FP16 = torch.float32, torch.bfloat16, torch.float16


@dataclass(frozen=True)
class PrecisionPolicy:
    type: str
    param_dtype: torch.dtype
    """The dtype the model's parameters are held in (and the forward reads)."""
    compute_dtype: torch.dtype
    """The dtype of matrix products."""
    master_dtype: torch.dtype | None
    """Dtype of the master copy the optimizer updates, or None when the parameters are the masters."""
    grad_accumulation_dtype: torch.dtype
    grad_reduction_dtype: torch.dtype
    optimizer_state_dtype: torch.dtype
    stochastic_rounding: bool
    """Round to bf16 stochastically where bf16 values are made from higher-precision ones."""
    parallel_layers_reduce_dtype: torch.dtype
    """Dtype of the tensor-parallel all-reduce / reduce-scatter inside parallel layers."""
    float8: Float8Spec | None = None
    """The decoder layers' matmuls in float8 (torchao's, see `float8`); None: in the compute dtype."""

    @property
    def autocast(self) -> bool:
        """Compute in a lower dtype than the parameters through torch.autocast."""
        return self.compute_dtype != self.param_dtype

    @property
    def needs_bf16(self) -> bool:
        return BF16 in (self.param_dtype, self.compute_dtype)

    @property
    def needs_loss_scaling(self) -> bool:
        """fp16 gradients underflow without a loss scale."""
        return FP16 in (self.param_dtype, self.compute_dtype)


def resolve_policy(
    type: str,
    *,
    master_weights: bool = False,
    fp32_grad_acc: bool = False,
    fp32_grads_cc: bool = False,
    xla_use_bf16: bool = False,
    xla_downcast_bf16: bool = False,
    stochastic_rounding: bool = False,
    parallel_layers_reduce_dtype: torch.dtype | None = None,
    fp32_optimizer_state: bool = False,
    float8: Float8Spec | None = None,
) -> PrecisionPolicy:
    """The policy of `type`; the keyword knobs are read only for `manual` (the config warns when they
    are set for another type). `fp32_optimizer_state` is the optimizer's request (adamw_fp32OptState)."""
    if type == "fp32":
        fields = (FP32, FP32, None, FP32, FP32, False)
    elif type == "autocast":
        fields = (FP32, BF16, None, FP32, FP32, False)
    elif type in ("mixed_precision", "mixed_precisionSR"):
        fields = (BF16, BF16, FP32, FP32, FP32, type == "mixed_precisionSR")
    elif type == "bf16SR":
        fields = (BF16, BF16, None, BF16, BF16, True)
    elif type == "fp16":
        fields = (FP16, FP16, FP32, FP32, FP32, False)
    elif type == "fp16_autocast":
        fields = (FP32, FP16, None, FP32, FP32, False)
    elif type == "manual":
        if xla_use_bf16 and xla_downcast_bf16:
            raise PrecisionConfigError(
                "precision.xla_use_bf16 and precision.xla_downcast_bf16: expected at most one of them '1' (bf16 "
                "parameters, or bf16 compute over fp32 parameters), found both"
            )
        param = BF16 if xla_use_bf16 else FP32
        compute = BF16 if xla_use_bf16 or xla_downcast_bf16 else FP32
        if master_weights and param == FP32:
            raise PrecisionConfigError(
                "precision.master_weights: fp32 master weights need bf16 parameters (xla_use_bf16: '1'); with fp32 "
                "parameters they would be a second fp32 copy"
            )
        gradient = FP32 if param == FP32 or fp32_grad_acc else BF16
        reduction = FP32 if param == FP32 or fp32_grads_cc else BF16
        fields = (param, compute, FP32 if master_weights else None, gradient, reduction, stochastic_rounding)
    else:
        raise PrecisionConfigError(f"precision.type: expected one of {', '.join(TYPES)}, found {type!r}")
    param, compute, master, accumulation, reduction, rounding = fields
    stepped = master or param
    return PrecisionPolicy(
        type=type,
        param_dtype=param,
        compute_dtype=compute,
        master_dtype=master,
        grad_accumulation_dtype=accumulation,
        grad_reduction_dtype=reduction,
        optimizer_state_dtype=FP32 if fp32_optimizer_state else stepped,
        stochastic_rounding=rounding,
        parallel_layers_reduce_dtype=parallel_layers_reduce_dtype or (FP32 if type in ("fp32", *LOSS_SCALED) else BF16),
        float8=float8,
    )


def bf16_support_problem(policy: PrecisionPolicy, device: torch.device) -> str | None:
    """Why `device` cannot run `policy`, or None: bf16 needs a device whose kernels support it."""
    if not policy.needs_bf16:
        return None
    if device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        name = torch.cuda.get_device_name(device)
        return (
            f"precision.type: {policy.type} computes in bf16, which {name} does not support natively "
            "(compute capability 8.0 or newer); expected fp32 on this device"
        )
    if device.type == "mps" and not torch.backends.mps.is_macos_or_newer(14, 0):
        return f"precision.type: {policy.type} computes in bf16, which MPS supports from macOS 14; expected fp32"
    return None
