"""Position encodings beside rotary embeddings (see `attention`): fixed sinusoids added to the token
embeddings, ALiBi's per-head linear biases on the attention scores (Press et al. 2022) and T5's learned
relative position buckets (Raffel et al. 2020), all as GPT-NeoX defines them; and bitsandbytes' StableEmbedding,
the learned position table GPT-NeoX builds with use_bnb_optimizer."""

from __future__ import annotations

import math

import torch
from torch import nn

from .distributed_types import is_dtensor


def sinusoidal_embedding(position_ids: torch.Tensor, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """(batch, seq, hidden): [sin(p w) | cos(p w)] with w_i = 10000^(-2i / hidden), all sines first (NeoX's
    layout, not interleaved); computed in fp32."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, hidden, 2, dtype=torch.float32, device=position_ids.device) / hidden))
    angles = position_ids[..., None].float() * inv_freq
    return torch.cat((angles.sin(), angles.cos()), dim=-1).to(dtype)


class StableEmbedding(nn.Embedding):
    """bitsandbytes' StableEmbedding (Dettmers et al. 2022): the looked-up rows through a LayerNorm (eps 1e-5)
    computed in fp32, returned in the table's dtype. GPT-NeoX makes its learned position table one when
    use_bnb_optimizer is set; bitsandbytes' optimizers keep its moments in fp32 (the model family's
    `fp32_state_parameters`)."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.norm = nn.LayerNorm(embedding_dim)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (nn.Embedding's name)
        rows, norm = super().forward(input), self.norm
        return nn.functional.layer_norm(
            rows.float(), norm.normalized_shape, norm.weight.float(), norm.bias.float(), norm.eps
        ).to(rows.dtype)


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


def relative_position_bucket(relative_position: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's causal bucket of each key - query distance: a key n <= 0 positions back (later keys count as 0)
    falls in bucket n for n below num_buckets / 2, then in logarithmically wider buckets up to max_distance,
    beyond which all share the last bucket."""
    distance = (-relative_position).clamp(min=0)
    exact = num_buckets // 2
    small = distance < exact
    scaled = torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact) * (num_buckets - exact)
    large = (exact + scaled.long()).clamp(max=num_buckets - 1)
    return torch.where(small, distance, large)


class RelativePositionBias(nn.Module):
    """GPT-NeoX's `pos_emb: rpe`: one learned bias per bucket and head, shared by every layer and added to the
    scaled attention scores, times sqrt(head_dim) (NeoX's scale). `weight` is (num_buckets, heads); tensor
    parallelism gives each rank its heads' columns."""

    def __init__(self, heads: int, head_dim: int, num_buckets: int, max_distance: int):
        super().__init__()
        self.num_buckets, self.max_distance, self.scale = num_buckets, max_distance, math.sqrt(head_dim)
        self.weight = nn.Parameter(torch.empty(num_buckets, heads))

    def forward(self, seq: int, past: int = 0) -> torch.Tensor:
        """(this rank's heads, seq, past + seq) float32 bias of queries at positions past .. past + seq - 1."""
        weight = self.weight.to_local() if is_dtensor(self.weight) else self.weight
        query = torch.arange(past, past + seq, device=weight.device)
        key = torch.arange(past + seq, device=weight.device)
        buckets = relative_position_bucket(key[None, :] - query[:, None], self.num_buckets, self.max_distance)
        return (weight.float()[buckets] * self.scale).permute(2, 0, 1)
