"""Stochastic rounding from fp32 to bf16: round up with probability equal to the distance from the
lower neighbour over the spacing, so E[round(x)] = x and updates smaller than half a bf16 step still
move a parameter on average (round-to-nearest drops them every time).

bf16 is the upper half of an fp32's bits, so adding uniform random 16-bit noise to the low half and
truncating is exactly that rule (in magnitude, hence for either sign), vectorised over the tensor.
"""

from __future__ import annotations

import math

import torch

LOW_BITS = 1 << 16
LOW_MASK = LOW_BITS - 1
HIGH_MASK = -LOW_BITS  # 0xFFFF0000 as int32


def stochastic_round(values: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """`values` (any float dtype) rounded stochastically to bf16; inf and NaN pass through.

    In place over the noise: add the bits, mask the low half, convert. inf has zero low bits, so it
    stays inf; a NaN whose payload lies in the low half only would read as inf after the mask (or wrap
    to zero), so NaNs are set again. On CPU that pass runs only when the tensor's sum is not finite:
    a sum is one read, while a mask and a fill are two passes and a fresh buffer (the host waits for
    the sum, which costs nothing there and would stall a GPU stream, where the fill stays)."""
    single = values.detach().to(torch.float32).contiguous()
    noise = _random_low_bits(single.numel(), single.device, generator).view(single.shape)
    noise.add_(single.view(torch.int32)).bitwise_and_(HIGH_MASK)
    rounded = noise.view(torch.float32).to(torch.bfloat16)  # exact: the low bits are zero
    if single.device.type != "cpu" or not math.isfinite(single.sum().item()):
        rounded.masked_fill_(torch.isnan(single), float("nan"))
    return rounded


@torch.no_grad()
def copy_stochastically_rounded_(
    target: torch.Tensor, source: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """target (bf16) <- stochastic_round(source), in place; returns target."""
    return target.copy_(stochastic_round(source, generator))


def _random_low_bits(count: int, device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    """`count` uniform integers in [0, 2**16) as int32. Every bit of a full-range 64-bit draw is used:
    the draw fills the upper half of the buffer, whose 32-bit words' low halves go to the lower half
    and whose high halves stay, shifted down (four values per draw, half the draws of two per draw;
    the draw dominates the rounding on CPU)."""
    size = -(-count // 4) * 4
    half = size // 2
    words = torch.empty(size, dtype=torch.int32, device=device)
    words[half:].view(torch.int64).random_(-(2**63), None, generator=generator)
    torch.bitwise_and(words[half:], LOW_MASK, out=words[:half])
    words[half:].bitwise_right_shift_(16).bitwise_and_(LOW_MASK)
    return words[:count]
