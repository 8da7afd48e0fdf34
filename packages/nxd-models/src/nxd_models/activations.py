"""MLP activations by the names the config uses, and whether each is gated.

A gated activation computes act(gate(x)) * up(x) (GLU variants, Shazeer 2020); the others act(up(x)).
GPT-NeoX's names are read as NeoX computes them: `swish` is silu, `bilinear` applies no function, `glu`
the sigmoid, and `approx-gelu` is gelu's tanh approximation (what NeoX's fused bias-gelu computes).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

Activation = Callable[[torch.Tensor], torch.Tensor]


def identity(x: torch.Tensor) -> torch.Tensor:
    return x


def approximate_gelu(x: torch.Tensor) -> torch.Tensor:
    """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: dict[str, tuple[Activation, bool]] = {
    "gelu": (F.gelu, False),
    "approx-gelu": (approximate_gelu, False),
    "relu": (F.relu, False),
    "silu": (F.silu, False),
    "mish": (F.mish, False),
    "softsign": (F.softsign, False),
    "swiglu": (F.silu, True),
    "geglu": (F.gelu, True),
    "reglu": (F.relu, True),
    "bilinear": (identity, True),
    "glu": (torch.sigmoid, True),
}
"""Activation name -> (function, gated)."""

HF_ACTIVATIONS = {"gelu": "gelu", "approx-gelu": "gelu_pytorch_tanh", "relu": "relu", "silu": "silu", "mish": "mish"}
"""transformers' `hidden_act` names computing the same ungated function."""
