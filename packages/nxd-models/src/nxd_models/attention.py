"""Rotary embeddings and the attention core shared by the Megatron-style decoder.

Three attention paths, chosen by the fusions keys:
- flash: `scaled_dot_product_attention` with the flash / memory-efficient / cuDNN kernels allowed;
- fused softmax: `scaled_dot_product_attention` restricted to its math kernel (scale, mask and
  softmax in one op chain);
- unfused: Megatron's CoreAttention written out (Q*K^T, scale, causal mask, fp32 softmax, dropout,
  times V), the only path where `apply_query_key_layer_scaling` changes the arithmetic: scores are
  divided by the layer number and multiplied back inside the fp32 softmax, which keeps fp16/bf16
  scores in range. The fused kernels accumulate the softmax in fp32 already, where that scaling is an
  identity.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import StrEnum

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from .distributed_types import is_block_mask
from .errors import ModelConfigError
from .sparse_attention import flex_block_sparse


class AttentionKernel(StrEnum):
    """How the attention core computes softmax(QK^T)V: torch's fused SDPA (flash), or explicit scores with a
    fused or unfused softmax (NxDT's fusions keys); the same arithmetic each way."""

    FLASH = "flash"
    FUSED_SOFTMAX = "fused_softmax"
    UNFUSED = "unfused"

    @classmethod
    def from_fusions(cls, flash_attention: bool, softmax: bool) -> AttentionKernel:
        if flash_attention:
            return cls.FLASH
        return cls.FUSED_SOFTMAX if softmax else cls.UNFUSED


ContextParallelAttention = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, float | None], torch.Tensor
]
"""(query, key, value, document_ids, scale) -> output: causal attention of this rank's part of a
sequence split across ranks (nxd-parallel's ring attention), in CoreAttention's layout."""

_FAST_BACKENDS = [
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.MATH,
]


def rotary_inverse_frequencies(rotary_dim: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    """RoPE inverse frequencies theta^(-2i/d) for i < d/2, in fp32."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim
    return 1.0 / (theta**exponents)


def rotary_cos_sin(
    position_ids: torch.Tensor, rotary_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (batch, seq, rotary_dim) in the rotate-half layout (Megatron and HF Llama)."""
    inv_freq = rotary_inverse_frequencies(rotary_dim, theta, position_ids.device)
    freqs = position_ids[..., None].float() * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first cos.shape[-1] dims of each head of x (batch, heads, seq, head_dim)."""
    rotary_dim = cos.shape[-1]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rotated, passthrough = x[..., :rotary_dim], x[..., rotary_dim:]
    rotated = rotated * cos + _rotate_half(rotated) * sin
    return torch.cat((rotated, passthrough), dim=-1) if passthrough.shape[-1] else rotated


MASKED_ROWS_UP_TO = 512
"""Packed rows of at most this many positions attend their documents through one masked product rather than a call
per document: there the calls cost more than the masked positions' work (forward and backward on CPU, 4 heads of 64
for the first, 8 for the others: 38 rows of 40 positions, 2 documents each: 3 ms masked, 24 ms by span; 8 rows of
512, 4 each: 110 ms, 129 ms; 4 rows of 2,048, 8 each: 847 ms, 425 ms)."""

Spans = list[list[tuple[int, int]]]
"""Per row of a batch, the (start, end) positions of each document, covering the row."""


def document_spans(document_ids: torch.Tensor) -> Spans | None:
    """Each row's documents as (start, end) spans when every document is one contiguous run of
    positions (packed records, Megatron's reset_attention_mask); None when a document is split or positions
    every document sees (negative ids) are present."""
    if bool((document_ids < 0).any()):
        return None
    spans = []
    for row in document_ids.detach().cpu():
        starts = [0, *(torch.nonzero(row[1:] != row[:-1]).flatten() + 1).tolist()]
        if len(starts) != len(torch.unique(row)):
            return None
        spans.append(list(zip(starts, [*starts[1:], len(row)], strict=True)))
    return spans


def span_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    spans: Spans,
    *,
    dropout: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal attention within each document span of each row; query (b, hq, s, d), key/value
    (b, hkv, s, d). SDPA's fused causal kernel runs on each document instead of one masked product
    over the whole row: it costs the sum of the documents' squared lengths rather than the row's, and
    builds no mask (on CPU a mask also forces SDPA's unfused path). Rows with the same spans share calls."""
    gqa = key.shape[1] != query.shape[1]

    def attend(rows: slice, start: int, end: int) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            query[rows, :, start:end],
            key[rows, :, start:end],
            value[rows, :, start:end],
            dropout_p=dropout,
            is_causal=True,
            scale=scale,
            enable_gqa=gqa,
        )

    if all(row == spans[0] for row in spans):
        return torch.cat([attend(slice(None), start, end) for start, end in spans[0]], dim=2)
    return torch.cat(
        [
            torch.cat([attend(slice(index, index + 1), start, end) for start, end in row], dim=2)
            for index, row in enumerate(spans)
        ]
    )


def document_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """(b, 1, s, s) True where query i may attend key j: j <= i within the same document, or j a position every
    document sees (a negative id: a soft prompt's)."""
    seq = document_ids.shape[-1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=document_ids.device).tril()
    same = (document_ids[:, :, None] == document_ids[:, None, :]) | (document_ids[:, None, :] < 0)
    return (causal & same).unsqueeze(1)


def sliding_window_mask(seq: int, window: int, document_ids: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """(b or 1, 1, s, s) True where query i may attend key j: i - window < j <= i (Mistral's sliding
    window, as transformers masks it), and within the same document when `document_ids` are given."""
    position = torch.arange(seq, device=device)
    distance = position[:, None] - position[None, :]
    allowed = ((distance >= 0) & (distance < window))[None, None]
    if document_ids is not None:
        allowed = allowed & document_mask(document_ids)
    return allowed


def _causal(seq_q: int, seq_k: int, device: torch.device) -> torch.Tensor:
    """(seq_q, seq_k) True where query i may attend key j: j <= i + seq_k - seq_q (the queries are the last
    seq_q of the seq_k positions: the whole sequence in training, the newest tokens when decoding)."""
    return torch.ones(seq_q, seq_k, dtype=torch.bool, device=device).tril(diagonal=seq_k - seq_q)


class CoreAttention(nn.Module):
    """softmax(Q K^T / sqrt(d)) V with a causal mask; the unit selective recomputation names."""

    def __init__(self, layer_number: int, kernel: AttentionKernel, dropout: float, query_key_layer_scaling: bool):
        super().__init__()
        self.layer_number = layer_number
        self.kernel = kernel
        self.dropout = dropout
        self.query_key_layer_scaling = query_key_layer_scaling
        self.context_parallel: ContextParallelAttention | None = None
        """Set by `use_context_parallel`: attention over a sequence split across ranks."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        allowed: torch.Tensor | Spans | None = None,
        documents: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query (b, hq, s, d), key/value (b, hkv, t, d) with hq a multiple of hkv (t > s when decoding with a
        key/value cache: the queries are the newest s of t positions); returns (b, hq, s, d).
        `allowed` confines attention to documents: their spans (`document_spans`; fused kernels only),
        or a (b, 1, s, s) mask replacing the causal one (True: may attend, see `document_mask`); a
        context-parallel attention takes the document ids (b, s) instead. `bias` (hq, s, t), when given, is
        added to the scaled scores (ALiBi's slopes, rpe's buckets); `allowed` is then a mask or None."""
        if is_block_mask(allowed):  # a block-sparse layout on CUDA: FlexAttention computes its blocks only
            return flex_block_sparse(query, key, value, allowed)
        if self.context_parallel is not None:
            if bias is not None:
                raise ModelConfigError(
                    "model.position_embedding_type: alibi and rpe are not available with context "
                    "parallelism (ring attention sees no whole score matrix to bias)"
                )
            return self.context_parallel(query, key, value, documents, None)
        dropout = self.dropout if self.training else 0.0
        if self.kernel is AttentionKernel.UNFUSED:
            return self._unfused(query, key, value, dropout, allowed, bias)
        backends = _FAST_BACKENDS if self.kernel is AttentionKernel.FLASH else [SDPBackend.MATH]
        with sdpa_kernel(backends):
            if isinstance(allowed, list):
                return span_attention(query, key, value, allowed, dropout=dropout)
            if bias is not None:
                allowed = _causal(query.shape[2], key.shape[2], query.device) if allowed is None else allowed
                allowed = bias.to(query.dtype).masked_fill(~allowed, float("-inf"))
            causal = allowed is None
            if causal and query.shape[2] != key.shape[2]:  # decoding: the queries are the newest positions
                allowed = None if query.shape[2] == 1 else _causal(query.shape[2], key.shape[2], query.device)
                causal = False
            return F.scaled_dot_product_attention(
                query,
                key,
                value,
                attn_mask=allowed,
                dropout_p=dropout,
                is_causal=causal,
                enable_gqa=key.shape[1] != query.shape[1],
            )

    def _unfused(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        dropout: float,
        allowed: torch.Tensor | None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        groups = query.shape[1] // key.shape[1]
        if groups > 1:
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        coefficient = float(self.layer_number) if self.query_key_layer_scaling else 1.0
        scores = torch.matmul(query, key.transpose(-2, -1)) / (math.sqrt(query.shape[-1]) * coefficient)
        seq_q, seq_k = scores.shape[-2], scores.shape[-1]
        hidden = ~_causal(seq_q, seq_k, scores.device) if allowed is None else ~allowed
        scores = scores.float() * coefficient
        if bias is not None:
            scores = scores + bias
        scores = scores.masked_fill(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(query.dtype)
        probs = F.dropout(probs, p=dropout, training=dropout > 0)
        return torch.matmul(probs, value)
