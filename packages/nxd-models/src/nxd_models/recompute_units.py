"""NxDT's names of recompute units (`activations_checkpoint_recompute`) in both model families.

NxDT names the modules of its own models: `CoreAttention` (softmax(QK^T)V), `ActivationMultiplyMLP`
(the MLP's act(gate) * up), and transformers' `LlamaMLP` / `LlamaRMSNorm`. A transformers MLP computes
act(gate) * up inline, so `ActivationMultiplyMLP` there is a module nxd adds (no parameters, the same
arithmetic); nxd's Megatron-style MLP holds one as `activation_multiply`, and answers to the Llama
names for its MLP and RMSNorm.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
from torch import nn

ACTIVATION_MULTIPLY = "ActivationMultiplyMLP"
MEGATRON_ALIASES = {"LlamaMLP": "MLP", "LlamaRMSNorm": "RMSNorm"}
"""NxDT's (transformers') class names -> the Megatron-style modules that compute the same thing."""


class ActivationMultiplyMLP(nn.Module):
    """act(gate) * up, the elementwise heart of a gated MLP, as its own module so that it can be
    recomputed alone (its inputs kept, its intermediate activation rebuilt in backward)."""

    def __init__(self, activation: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.activation = activation

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self.activation(gate) * up


def _gated_forward(mlp: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    return mlp.down_proj(mlp.activation_multiply(mlp.gate_proj(hidden), mlp.up_proj(hidden)))


def split_activation_multiply(model: nn.Module) -> None:
    """Give every transformers gated MLP of `model` (gate_proj, up_proj, down_proj, act_fn) an
    `activation_multiply` module computing what its forward computed inline, and route its forward
    through it. Parameter names and values do not change."""
    for module in model.modules():
        if all(hasattr(module, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn")) and not hasattr(
            module, "activation_multiply"
        ):
            module.activation_multiply = ActivationMultiplyMLP(module.act_fn)
            module.forward = types.MethodType(_gated_forward, module)
