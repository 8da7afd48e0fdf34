"""Weight initialisations by GPT-NeoX's names (megatron/model/init_functions.py).

`std` is `init_method_std`, `layers` the decoder's layer count and `hidden` its width. The fans of the
xavier methods are those of the whole projection a weight belongs to (NeoX fuses q, k and v, and gate with
up, into one matrix), passed in by the caller.
"""

from __future__ import annotations

import math

import torch
from torch import nn

INIT_METHODS = (
    "normal",
    "scaled_normal",
    "single_residual_scaled_normal",
    "small_init",
    "wang_init",
    "xavier_uniform",
    "xavier_normal",
    "orthogonal",
    "scaled_orthogonal",
)


def normal_std(method: str, std: float, layers: int, hidden: int) -> float | None:
    """The standard deviation of a normal method (None for the fan-based and orthogonal ones)."""
    return {
        "normal": std,
        "scaled_normal": std / math.sqrt(2.0 * layers),
        "single_residual_scaled_normal": std / math.sqrt(layers),
        "small_init": math.sqrt(2.0 / (5.0 * hidden)),
        "wang_init": 2.0 / (layers * math.sqrt(hidden)),
    }.get(method)


def _orthogonal(weight: torch.Tensor, gain: float) -> None:
    """torch's orthogonal init on one thread: LAPACK's QR rounds differently with the thread count, and a
    process that keeps shards must draw what a one-process build draws."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        nn.init.orthogonal_(weight, gain=gain)
    finally:
        torch.set_num_threads(threads)


@torch.no_grad()
def init_weight(
    weight: torch.Tensor, method: str, *, std: float, layers: int, hidden: int, fans: tuple[int, int] | None = None
) -> None:
    """Draw `weight` (out, in) by `method`; `fans` (fan_in, fan_out) default to the weight's own."""
    fan_in, fan_out = fans or (weight.shape[1] if weight.dim() > 1 else 1, weight.shape[0])
    if (sigma := normal_std(method, std, layers, hidden)) is not None:
        nn.init.normal_(weight, 0.0, sigma)
    elif method == "xavier_uniform":
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        nn.init.uniform_(weight, -bound, bound)
    elif method == "xavier_normal":
        nn.init.normal_(weight, 0.0, math.sqrt(2.0 / (fan_in + fan_out)))
    elif method in ("orthogonal", "scaled_orthogonal"):
        _orthogonal(weight, math.sqrt(2.0 / (1 if method == "orthogonal" else layers)))
    else:
        raise ValueError(f"init method: expected one of {', '.join(INIT_METHODS)}, found {method!r}")
