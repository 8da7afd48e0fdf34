"""Optimizers by the names of NxDT's `model.optim.name`, built from plain keyword options.

Adafactor is transformers' (imported only when asked for: `pip install nxd-precision[adafactor]`);
NovoGrad is NeMo's variant (`novograd.py`); every other name is a torch optimizer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from .errors import PrecisionConfigError
from .novograd import Novograd

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
}
OPTIMIZER_NAMES = (*_TORCH, "adafactor")
_FOREACH = set(_TORCH) - {"novograd"}
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
    parameters: Iterable[torch.Tensor], weight_decay: float | None, decay_norms_and_biases: bool
) -> list[dict[str, Any]]:
    """Megatron's grouping: no weight decay on biases and norm weights (1-D parameters) unless
    do_layer_norm_weight_decay asks for it; one group for an optimizer without weight decay (None)."""
    parameters = list(parameters)
    if weight_decay is None:
        return [{"params": [p for p in parameters if p.requires_grad]}]
    decay, no_decay = [], []
    for parameter in parameters:
        if parameter.requires_grad:
            (decay if decay_norms_and_biases or parameter.ndim > 1 else no_decay).append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(
    name: str, parameters: Iterable[torch.Tensor], options: Mapping[str, Any], *, decay_norms_and_biases: bool
) -> torch.optim.Optimizer:
    """Optimizer `name` over `parameters` (a model's, or their fp32 copies) with `options` (lr,
    weight_decay, betas, ...). Under ZeRO-1 the parameters are 1/dp shards, so its state is too."""
    cls, arguments = optimizer_class(name), optimizer_arguments(name, options)
    weight_decay = arguments.pop("weight_decay", None)
    groups = parameter_groups(parameters, weight_decay, decay_norms_and_biases)
    chosen = implementation(name, [p for group in groups for p in group["params"]])
    return cls(groups, **(chosen | arguments))
