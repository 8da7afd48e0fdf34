"""Norm layers by the config's names: torch's LayerNorm (with its affine weight and bias, or without them:
GPT-NeoX's non_parametric_layernorm) and RMSNorm, and ScaleNorm (Nguyen and Salazar 2019, as GPT-NeoX builds
it), which torch lacks."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

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


QK_NORMS = ("layernorm", "non_parametric_layernorm", "scalenorm")
"""The norms GPT-NeoX's use_qk_layernorm can build (its RMSNorm and Transformer Engine's take no two-dimensional
shape: NeoX stops on them)."""


class QueryKeyNorm(nn.Module):
    """GPT-NeoX's `use_qk_layernorm`: one norm, applied to each token's queries and then to its keys with the same
    weights, of the model's norm type built over (heads, head_dim) as NeoX builds it. A layernorm therefore
    standardises all heads of a token together (weight and bias per head and dimension); scalenorm divides each
    head by its own L2 norm (one learned scalar). Takes (batch, seq, heads, head_dim); under tensor parallelism a
    rank's heads arrive as a slice of dimension 2 (the plan's replicated_with_grad_allreduce), and the
    reductions over them cover every rank's heads."""

    def __init__(self, kind: str, heads: int, head_dim: int, eps: float):
        super().__init__()
        self.kind, self.eps = kind, eps
        if kind == "layernorm":
            self.weight = nn.Parameter(torch.ones(heads, head_dim))
            self.bias = nn.Parameter(torch.zeros(heads, head_dim))
        elif kind == "scalenorm":
            self.weight = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "scalenorm":
            normed = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=self.eps) * self.weight
        else:
            values = x.float()
            centred = values - values.mean(dim=(-2, -1), keepdim=True)
            normed = centred * torch.rsqrt(centred.square().mean(dim=(-2, -1), keepdim=True) + self.eps)
            if self.kind == "layernorm":
                normed = normed * self.weight + self.bias
            normed = normed.to(x.dtype)
        if isinstance(x, DTensor):  # back to this rank's heads, whatever layout DTensor chose on the way
            normed = normed.redistribute(x.device_mesh, x.placements)
        return normed
