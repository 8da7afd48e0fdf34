"""Norm layers by the config's names: torch's LayerNorm (with its affine weight and bias, or without them:
GPT-NeoX's non_parametric_layernorm) and RMSNorm, and ScaleNorm (Nguyen and Salazar 2019, as GPT-NeoX builds
it), which torch lacks."""

from __future__ import annotations

import torch
from torch import nn

NORMS = ("layernorm", "rmsnorm", "scalenorm", "non_parametric_layernorm")


class ScaleNorm(nn.Module):
    """g x / max(||x||_2, eps) over the last dimension, with one learned scalar g (initialised to 1)."""

    def __init__(self, eps: float = 1e-8):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=self.eps) * self.weight


def build_norm(kind: str, hidden: int, eps: float) -> nn.Module:
    """The norm layer `kind` (one of NORMS) over `hidden` features."""
    if kind == "rmsnorm":
        return nn.RMSNorm(hidden, eps=eps)
    if kind == "scalenorm":
        return ScaleNorm(eps)
    if kind == "non_parametric_layernorm":  # (x - mean) / sqrt(var + eps): nothing learned
        return nn.LayerNorm(hidden, eps=eps, elementwise_affine=False, bias=False)
    return nn.LayerNorm(hidden, eps=eps)
