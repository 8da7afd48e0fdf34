"""Position encodings beside rotary embeddings (see `attention`): fixed sinusoids added to the token
embeddings, and ALiBi's per-head linear biases on the attention scores (Press et al. 2022), both as
GPT-NeoX defines them."""

from __future__ import annotations

import math

import torch


def sinusoidal_embedding(position_ids: torch.Tensor, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """(batch, seq, hidden): [sin(p w) | cos(p w)] with w_i = 10000^(-2i / hidden), all sines first (NeoX's
    layout, not interleaved); computed in fp32."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, hidden, 2, dtype=torch.float32, device=position_ids.device) / hidden))
    angles = position_ids[..., None].float() * inv_freq
    return torch.cat((angles.sin(), angles.cos()), dim=-1).to(dtype)


def alibi_slopes(heads: int) -> list[float]:
    """ALiBi's head slopes: for a power of two n, 2^(-8/n) to the powers 1..n; otherwise those of the power of
    two below n, then every other slope of twice that power (the paper's rule, as NeoX implements it)."""

    def powers(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]

    if math.log2(heads).is_integer():
        return powers(heads)
    closest = 2 ** math.floor(math.log2(heads))
    return powers(closest) + powers(2 * closest)[0::2][: heads - closest]


def alibi_bias(slopes: list[float], seq: int, device: torch.device, past: int = 0) -> torch.Tensor:
    """(heads, seq, past + seq) float32 bias -slope (i - j) of query i over key j (positive above the diagonal,
    where causal masking hides it); the queries sit at positions past .. past + seq - 1 (decoding)."""
    query = torch.arange(past, past + seq, device=device, dtype=torch.float32)
    key = torch.arange(past + seq, device=device, dtype=torch.float32)
    distance = query[:, None] - key[None, :]
    return -torch.tensor(slopes, device=device, dtype=torch.float32)[:, None, None] * distance
