"""`model.optim`: the optimizer of every name the reference lists, with its documented parameters."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from nxd_config.schema.optim import Optimizer as OptimizerConfig
from transformers.optimization import Adafactor

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
    "adafactor": Adafactor,
}
_NOT_PASSED = {"name", "sched"}
_FOREACH = {"adamw", "adamw_fp32OptState", "adam", "adamax", "adadelta", "rmsprop", "rprop", "sgd", "adagrad"}


def optimizer_class_and_arguments(optim: OptimizerConfig) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The optimizer class and the keyword arguments the config gives it (every documented key)."""
    arguments = {name: getattr(optim, name) for name in type(optim).model_fields if name not in _NOT_PASSED}
    if optim.name == "adafactor":  # transformers' Adafactor takes the exponent negated
        arguments["decay_rate"] = -abs(arguments["decay_rate"])
    if optim.name in _FOREACH:
        arguments["foreach"] = False  # see DESIGN.md: a mix of DTensor and plain parameters breaks foreach
    return _TORCH[optim.name], arguments


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
    optim: OptimizerConfig, parameters: Iterable[torch.Tensor], *, decay_norms_and_biases: bool
) -> torch.optim.Optimizer:
    """The configured optimizer over `parameters` (a model's, or their fp32 copies). With zero1 they
    are 1/dp shards (FSDP2), so its state is sharded with them."""
    cls, arguments = optimizer_class_and_arguments(optim)
    weight_decay = arguments.pop("weight_decay", None)
    return cls(parameter_groups(parameters, weight_decay, decay_norms_and_biases), **arguments)
