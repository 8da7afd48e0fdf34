"""Optimizers by the names of NxDT's `model.optim.name`, built from plain keyword options.

Adafactor is transformers' (imported only when asked for: `pip install nxd-precision[adafactor]`);
NovoGrad is NeMo's variant (`novograd.py`), lion, madgrad_wd and sm3 are GPT-NeoX's (`neox_optimizers.py`),
adam8bit is bitsandbytes' 8-bit Adam on every layout (`adam8bit.py`); every other name is a torch optimizer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from .adam8bit import Adam8bit
from .errors import PrecisionConfigError
from .neox_optimizers import SM3, Lion, MadgradWD
from .novograd import Novograd
from .policy import PrecisionPolicy

_TORCH = {
    "adamw": torch.optim.AdamW,
    "adamw_fp32OptState": torch.optim.AdamW,
    "adam": torch.optim.Adam,
    "sgd": torch.optim.SGD,
    "adadelta": torch.optim.Adadelta,
    "adamax": torch.optim.Adamax,
    "adagrad": torch.optim.Adagrad,
    "rmsprop": torch.optim.RMSprop,
    "rprop": torch.optim.Rprop,
    "novograd": Novograd,
    "lion": Lion,
    "madgrad_wd": MadgradWD,
    "sm3": SM3,
    "adam8bit": Adam8bit,
}
OPTIMIZER_NAMES = (*_TORCH, "adafactor")
_FOREACH = set(_TORCH) - {"novograd", "lion", "madgrad_wd", "sm3", "adam8bit"}
"""The torch optimizers with a foreach (multi-tensor) implementation."""
_FUSED = {"adamw", "adamw_fp32OptState", "adam", "sgd", "adagrad"}
"""Those with a fused kernel (one pass over each tensor's memory), on CPU and CUDA."""


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor
    if name not in _TORCH:
        raise PrecisionConfigError(f"model.optim.name: expected one of {', '.join(OPTIMIZER_NAMES)}, found {name!r}")
    return _TORCH[name]


def optimizer_arguments(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments the optimizer class takes for `options` (the config's keys under their
    own names): transformers' Adafactor takes its decay exponent negated."""
    arguments = dict(options)
    if name == "adafactor" and "decay_rate" in arguments:
        arguments["decay_rate"] = -abs(arguments["decay_rate"])
    return arguments


def implementation(name: str, parameters: Sequence[torch.Tensor]) -> dict[str, bool]:
    """The fastest torch implementation `parameters` allow: the fused kernel where the optimizer has
    one and every tensor is a floating-point tensor on a CPU or CUDA device; else foreach when every
    tensor is of one kind (all plain, or all DTensors on one mesh: DESIGN.md's trap is the mix of
    the two, which tensor parallelism without sequence parallelism leaves); else the for-loop."""
    if name not in _FOREACH or not parameters:
        return {}
    kinds = {(type(p), getattr(p, "device_mesh", None), p.device.type) for p in parameters}
    if len(kinds) > 1:
        return {"foreach": False}
    devices = {p.device.type for p in parameters}
    if name in _FUSED and devices <= {"cpu", "cuda"} and all(p.is_floating_point() for p in parameters):
        return {"fused": True}
    return {"foreach": True}


def parameter_groups(
    parameters: Iterable[torch.Tensor],
    weight_decay: float | None,
    decay_norms_and_biases: bool,
    scales: Sequence[tuple[float, float]] | None = None,
    lr: float | None = None,
) -> list[dict[str, Any]]:
    """Megatron's grouping: no weight decay on biases and norm weights (1-D parameters) unless
    do_layer_norm_weight_decay asks for it; one group for an optimizer without weight decay (None).

    `scales`, one (learning rate, weight decay) multiplier pair per trainable parameter (muP's), split the groups
    further: each group steps with lr x its lr_scale and weight_decay x its weight_decay_scale, and keeps both
    scales, so that a schedule and a resumed run apply them too (`apply_schedule`, `apply_options`)."""
    trainable = [p for p in parameters if p.requires_grad]

    def decays(parameter: torch.Tensor) -> bool:
        return weight_decay is not None and (decay_norms_and_biases or parameter.ndim > 1)

    if scales is None:
        if weight_decay is None:
            return [{"params": trainable}]
        groups = [{"params": [p for p in trainable if decays(p)], "weight_decay": weight_decay}]
        if no_decay := [p for p in trainable if not decays(p)]:
            groups.append({"params": no_decay, "weight_decay": 0.0})
        return groups
    grouped: dict[tuple[float, float], list[torch.Tensor]] = {}
    for parameter, (lr_scale, decay_scale) in zip(trainable, scales, strict=True):
        grouped.setdefault((lr_scale, decay_scale if decays(parameter) else 0.0), []).append(parameter)
    return [
        {"params": params, "lr": lr * lr_scale, "lr_scale": lr_scale}
        | (
            {}
            if weight_decay is None
            else {"weight_decay": weight_decay * decay_scale, "weight_decay_scale": decay_scale}
        )
        for (lr_scale, decay_scale), params in grouped.items()
    ]


def build_optimizer(
    name: str,
    parameters: Iterable[torch.Tensor],
    options: Mapping[str, Any],
    *,
    decay_norms_and_biases: bool,
    scales: Sequence[tuple[float, float]] | None = None,
    fp32_state: Sequence[bool] | None = None,
) -> torch.optim.Optimizer:
    """Optimizer `name` over `parameters` (a model's, or their fp32 copies) with `options` (lr,
    weight_decay, betas, ...); `scales` as `parameter_groups` takes them; `fp32_state`, one flag per trainable
    parameter, marks those whose adam8bit state stays fp32 (bitsandbytes' StableEmbedding tables). Under ZeRO-1
    the parameters are 1/dp shards, so its state is too."""
    cls, arguments = optimizer_class(name), optimizer_arguments(name, options)
    weight_decay = arguments.pop("weight_decay", None)
    parameters = list(parameters)
    groups = parameter_groups(parameters, weight_decay, decay_norms_and_biases, scales, arguments.get("lr"))
    if name == "adam8bit" and fp32_state is not None:
        groups = _fp32_state_groups(groups, [p for p in parameters if p.requires_grad], fp32_state)
    chosen = implementation(name, [p for group in groups for p in group["params"]])
    return cls(groups, **(chosen | arguments))


def _fp32_state_groups(
    groups: list[dict[str, Any]], trainable: Sequence[torch.Tensor], fp32_state: Sequence[bool]
) -> list[dict[str, Any]]:
    """`groups` with the flagged parameters moved to copies of their groups that keep fp32 moments (as
    bitsandbytes' per-parameter override of optim_bits does). Each group says whether it decays by its
    weight_decay_scale, so that `apply_options` sets a resumed run's weight decay on every group that decays, not
    only the first."""
    flagged = {id(p) for p, flag in zip(trainable, fp32_state, strict=True) if flag}
    split = []
    for group in groups:
        if "weight_decay" in group and "weight_decay_scale" not in group:
            group = group | {"weight_decay_scale": 1.0 if group["weight_decay"] else 0.0}
        kept = [p for p in group["params"] if id(p) not in flagged]
        moved = [p for p in group["params"] if id(p) in flagged]
        split += [
            group | {"params": params} | extra
            for params, extra in ((kept, {}), (moved, {"fp32_state": True}))
            if params
        ]
    return split


def state_tensors(name: str, options: Mapping[str, Any]) -> int:
    """How many tensors the size of a parameter optimizer `name` keeps per parameter (its state, divided as the
    parameters are: adam8bit's state in 256-value blocks is `bytes_per_value`'s block_state)."""
    if name == "adam8bit":
        return 0
    if name in ("adamw", "adamw_fp32OptState", "adam"):
        return 3 if options.get("amsgrad") else 2
    if name in ("adamax", "adadelta", "rprop"):
        return 2
    if name in ("sgd", "sm3"):  # SM3's accumulators are one value per row, column, ...: left out
        return 1 if options.get("momentum") else 0
    if name == "rmsprop":
        return 1 + bool(options.get("momentum")) + bool(options.get("centered"))
    if name == "madgrad_wd":  # the sum of squares, the dual average s and (with momentum) the start x0
        return 2 + bool(options.get("momentum", 0.9))
    return 1  # adagrad's sum, novograd's first moment (its second is one value per tensor)


def bytes_per_value(policy: PrecisionPolicy, optimizer: str, options: Mapping[str, Any]) -> dict[str, int]:
    """Bytes per parameter value under `policy` and optimizer `optimizer` (for memory plans): the
    parameter, its gradient, its master weight and optimizer state (trainable values), what the step
    alone adds (fp32 copies of bf16 parameters and of their gradients when no master persists, and the
    state held in fp32 while it steps), and the activations' dtype ("compute"). "block_state" is state kept in
    256-value blocks of the whole tensor (adam8bit's two 8-bit moments; tensors under its min_8bit_size keep fp32
    ones, left out), divided as the parameter only where a rank's shard is whole blocks."""
    size = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2, torch.float64: 8}
    states = state_tensors(optimizer, options)
    copies = policy.param_dtype != torch.float32
    persistent = copies and policy.master_dtype is not None
    state_size = size[policy.optimizer_state_dtype]
    return {
        "parameter": size[policy.param_dtype],
        "gradient": size[policy.grad_accumulation_dtype],
        "master": 4 if persistent else 0,
        "optimizer_state": states * state_size,
        "step_copies": (8 if copies and not persistent else 0) + (states * (4 - state_size) if copies else 0),
        "compute": size[policy.compute_dtype],
        "block_state": 2 if optimizer == "adam8bit" else 0,
    }


def apply_options(optimizer: torch.optim.Optimizer, name: str, options: Mapping[str, Any]) -> None:
    """Set `options` (the config's, as `build_optimizer` took them) on an optimizer whose state was loaded
    from a checkpoint (torch's load_state_dict brings back the saved hyperparameters): weight decay on the
    groups that decay (the first, or each by its weight_decay_scale; a no-decay group stays at 0), every other
    hyperparameter on all groups. The learning rate is the schedule's (`apply_schedule`)."""
    arguments = optimizer_arguments(name, options)
    weight_decay = arguments.pop("weight_decay", None)
    arguments.pop("lr", None)
    for index, group in enumerate(optimizer.param_groups):
        group.update({key: value for key, value in arguments.items() if key in group})
        if weight_decay is not None and "weight_decay_scale" in group:
            group["weight_decay"] = weight_decay * group["weight_decay_scale"]
        elif weight_decay is not None and index == 0 and "weight_decay" in group:
            group["weight_decay"] = weight_decay
