"""Norm layers by the config's names: torch's LayerNorm (with its affine weight and bias, or without them:
GPT-NeoX's non_parametric_layernorm) and RMSNorm, and ScaleNorm (Nguyen and Salazar 2019, as GPT-NeoX builds
it), which torch lacks."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from .distributed_types import is_dtensor

NORMS = ("layernorm", "rmsnorm", "scalenorm", "non_parametric_layernorm")


class ScaleNorm(nn.Module):
    """g x / max(||x||_2, eps) over the last dimension, with one learned scalar g (initialised to 1)."""

    def __init__(self, eps: float = 1e-8):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=self.eps) * self.weight


def norm_builder(kind: str, eps: float) -> Callable[[int], nn.Module]:
    """The norm layer `kind` for any width: what a block builds its norms with."""
    return functools.partial(build_norm, kind, eps=eps)


def build_norm(kind: str, hidden: int, eps: float) -> nn.Module:
    """The norm layer `kind` (one of NORMS) over `hidden` features."""
    if kind == "rmsnorm":
        return nn.RMSNorm(hidden, eps=eps)
    if kind == "scalenorm":
        return ScaleNorm(eps)
    if kind == "non_parametric_layernorm":  # (x - mean) / sqrt(var + eps): nothing learned
        return nn.LayerNorm(hidden, eps=eps, elementwise_affine=False, bias=False)
    return nn.LayerNorm(hidden, eps=eps)


class QueryKeyNorm(nn.Module):
    """GPT-NeoX's `use_qk_layernorm`: one norm, applied to each token's queries and then to its keys with the same
    weights, of the model's norm type built over (heads, head_dim) as NeoX builds it. A layernorm therefore
    standardises all heads of a token together; rmsnorm and scalenorm reduce over each head's dimensions (torch's
    and NeoX's reductions over the last dimension). Weights are per head and dimension (a scalar for scalenorm),
    kept flat so that the optimizer treats them as the norm weights they are (no weight decay, as NeoX exempts its
    norms). Takes (batch, seq, heads, head_dim); under tensor parallelism a rank's heads arrive as a slice of
    dimension 2 (the plan's replicated_with_grad_allreduce) and a layernorm's reductions cover every rank's
    heads: the function of one rank at any size (NeoX normalises each rank's heads apart, so its own model
    changes with model_parallel_size)."""

    def __init__(self, kind: str, heads: int, head_dim: int, eps: float):
        super().__init__()
        self.kind, self.eps, self.shape = kind, eps, (heads, head_dim)
        if kind in ("layernorm", "rmsnorm"):
            self.weight = nn.Parameter(torch.ones(heads * head_dim))
        if kind == "layernorm":
            self.bias = nn.Parameter(torch.zeros(heads * head_dim))
        elif kind == "scalenorm":
            self.weight = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "scalenorm":
            normed = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=self.eps) * self.weight
        else:
            values = x.float()
            if self.kind == "rmsnorm":
                normed = values * torch.rsqrt(values.square().mean(dim=-1, keepdim=True) + self.eps)
            else:
                centred = values - values.mean(dim=(-2, -1), keepdim=True)
                normed = centred * torch.rsqrt(centred.square().mean(dim=(-2, -1), keepdim=True) + self.eps)
            if self.kind != "non_parametric_layernorm":
                normed = normed * self.weight.view(self.shape)
            if self.kind == "layernorm":
                normed = normed + self.bias.view(self.shape)
            normed = normed.to(x.dtype)
        if is_dtensor(x):  # back to this rank's heads, whatever layout DTensor chose on the way
            normed = normed.redistribute(x.device_mesh, x.placements)
        return normed
