"""Stochastic rounding from fp32 to bf16: round up with probability equal to the distance from the
lower neighbour over the spacing, so E[round(x)] = x and updates smaller than half a bf16 step still
move a parameter on average (round-to-nearest drops them every time).

bf16 is the upper half of an fp32's bits, so adding uniform random 16-bit noise to the low half and
truncating is exactly that rule (in magnitude, hence for either sign), vectorised over the tensor.
"""

from __future__ import annotations

import torch

LOW_BITS = 1 << 16
HIGH_MASK = -LOW_BITS  # 0xFFFF0000 as int32


def stochastic_round(values: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """`values` (any float dtype) rounded stochastically to bf16; inf and NaN pass through.

    Three passes over the noise, in place: add the bits, mask the low half, convert. inf has zero low
    bits, so it stays inf; a NaN whose payload lies in the low half only would read as inf after the
    mask, so NaNs are set again."""
    single = values.detach().to(torch.float32).contiguous()
    noise = _random_low_bits(single.numel(), single.device, generator).view(single.shape)
    noise.add_(single.view(torch.int32)).bitwise_and_(HIGH_MASK)
    rounded = noise.view(torch.float32).to(torch.bfloat16)  # exact: the low bits are zero
    return rounded.masked_fill_(torch.isnan(single), float("nan"))


@torch.no_grad()
def copy_stochastically_rounded_(target: torch.Tensor, source: torch.Tensor,
                                 generator: torch.Generator | None = None) -> torch.Tensor:  # fmt: skip
    """target (bf16) <- stochastic_round(source), in place; returns target."""
    return target.copy_(stochastic_round(source, generator))


def _random_low_bits(count: int, device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    """`count` uniform integers in [0, 2**16) as int32: 64-bit draws split in two halves, which is about
    1.5x faster than drawing 32-bit integers one by one on CPU (the draw dominates the rounding)."""
    words = torch.empty((count + 1) // 2, dtype=torch.int64, device=device).random_(generator=generator)
    return words.view(torch.int32)[:count].bitwise_and_(LOW_BITS - 1)
