"""gMLP and aMLP layers (Liu et al. 2021, "Pay Attention to MLPs"), as GPT-NeoX's `gmlp` / `amlp` layers compute them.

A layer maps x to out(sgu(act(in(norm(x))))): `in` widens to two halves (res, gate) of 4 x hidden each, and the
spatial gating unit returns res * (W norm(gate) + b), where W (seq x seq, causal: its upper triangle is never read)
mixes each feature over the positions up to the token's. aMLP adds a single-head attention of width
`gmlp_attn_dim` over the whole inner activations to the gate. As in NeoX's GMLPBlock, the layer's output replaces
the residual stream (NeoX adds no shortcut), its two projections have no bias (NeoX drops theirs), W starts at zero
and b at one (the gate starts as the identity), and the tiny attention's layers keep torch's default draw.

The layer's weights are whole on every rank: tensor parallelism computes it on each rank alike (NeoX's per-shard
norm and tiny attention would make the result depend on the split). Documents each see only their own tokens.
Decoding caches each position's normed gate (and the tiny attention's keys and values).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .activations import ACTIVATIONS, Activation
from .errors import ModelConfigError
from .kv_cache import LayerCache
from .layer_kinds import LayerKind
from .norms import norm_builder

GATING_KINDS = ("gmlp", "amlp")
"""Layer kinds that are a gMLP block in place of attention and MLP."""


@dataclass(frozen=True)
class GMLPSpec:
    """The settings of gmlp and amlp layers (GPT-NeoX's)."""

    attention_dim: int = 64
    """The width of an amlp layer's single-head attention (GPT-NeoX's gmlp_attn_dim)."""


WIDTH_MULTIPLE = 4
"""The inner width is 4 x hidden_size, as GPT-NeoX fixes it (GMLPBlock's ff_mult)."""


class TinyAttention(nn.Module):
    """aMLP's single-head causal attention of width `dim` over the inner activations (res and gate, 2 x `inner`),
    projected to `inner`: softmax(q k^T / sqrt(dim)) v, as NeoX's TinyAttention."""

    def __init__(self, inner: int, dim: int):
        super().__init__()
        self.dim = dim
        self.proj_qkv = nn.Linear(2 * inner, 3 * dim)
        self.proj_ffn = nn.Linear(dim, inner)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The queries, and the keys and values side by side (what a decoding cache keeps)."""
        query_key_value = self.proj_qkv(x)
        return query_key_value[..., : self.dim], query_key_value[..., self.dim :]

    def forward(self, query: torch.Tensor, keys_values: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        """`keys_values` (batch, tokens, 2 x dim) of every position read; `allowed` (1 or batch, 1, seq, tokens): the
        mask where not plain causal."""
        key, value = keys_values.split(self.dim, dim=-1)
        context = F.scaled_dot_product_attention(
            query.unsqueeze(1),
            key.unsqueeze(1),
            value.unsqueeze(1),
            attn_mask=allowed,
            is_causal=allowed is None,
            scale=self.dim**-0.5,
        )
        return self.proj_ffn(context.squeeze(1))


class SpatialGatingUnit(nn.Module):
    """res * (W norm(gate) + b [+ tiny attention]) over positions 0 .. `length` - 1; see the module docstring."""

    def __init__(self, inner: int, length: int, norm: nn.Module, attention_dim: int | None):
        super().__init__()
        self.inner, self.length = inner, length
        self.norm = norm
        self.proj = nn.Linear(length, length)
        self.attn = TinyAttention(inner, attention_dim) if attention_dim else None

    def forward(
        self, x: torch.Tensor, documents: torch.Tensor | None = None, cache: LayerCache | None = None
    ) -> torch.Tensor:
        res, gate = x.chunk(2, dim=-1)
        gate = self.norm(gate)
        batch, seq, _ = gate.shape
        query = keys_values = None
        if self.attn is not None:
            query, keys_values = self.attn.project(x)
        gates = gate
        if cache is not None:  # every position's normed gate (and tiny keys and values) so far
            kept = keys_values if keys_values is not None else gate.new_empty(batch, seq, 0)
            gates, keys_values = (t.squeeze(1) for t in cache.extend(gate.unsqueeze(1), kept.unsqueeze(1)))
        total = gates.shape[1]
        first = total - seq
        if total > self.length:
            raise ModelConfigError(
                f"model.attention_layers: a gMLP layer's spatial projection covers {self.length} "
                f"positions (the training sequence); found position {total - 1}"
            )
        allowed = _allowed(first, seq, documents, gate.device)
        weight = self.proj.weight[first:total, :total].masked_fill(~allowed, 0)  # (seq, total) or (b, seq, total)
        mixed = weight @ gates + self.proj.bias[first:total, None]
        if self.attn is not None:
            plain = documents is None and not first
            mixed = mixed + self.attn(query, keys_values, None if plain else allowed.unsqueeze(-3))
        return mixed * res


def _allowed(first: int, seq: int, documents: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """(seq, first + seq), or (batch, seq, seq) with documents: True where the token at position first + i may read
    position j: j <= first + i, within its document (a soft prompt's positions, id -1, in every document)."""
    query = torch.arange(first, first + seq, device=device)[:, None]
    causal = torch.arange(first + seq, device=device)[None, :] <= query
    if documents is None:
        return causal
    same = (documents[:, :, None] == documents[:, None, :]) | (documents[:, None, :] < 0)
    return causal & same


class GMLPLayer(nn.Module):
    """A gMLP (or aMLP with `attention_dim`) decoder layer: out(sgu(act(in(norm(x))))), no residual; called as a
    `DecoderLayer` is (the arguments of attention it has no use for are accepted and ignored)."""

    def __init__(
        self,
        hidden: int,
        length: int,
        norm: Callable[[int], nn.Module],
        activation: Activation,
        attention_dim: int | None,
    ):
        super().__init__()
        inner = WIDTH_MULTIPLE * hidden
        self.input_layernorm = norm(hidden)
        self.input_proj = nn.Linear(hidden, 2 * inner, bias=False)
        self.activation = activation
        self.spatial_gating = SpatialGatingUnit(inner, length, norm(inner), attention_dim)
        self.output_proj = nn.Linear(inner, hidden, bias=False)

    @property
    def kept_per_token(self) -> int:
        """Activations the backward keeps a token, about (memory plans): the two halves, their activation, the
        normed and mixed gate and the product."""
        return 6 * self.spatial_gating.inner

    def forward(
        self,
        hidden: torch.Tensor,
        rotary: object = None,
        allowed: object = None,
        documents: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        position_bias: object = None,
    ) -> torch.Tensor:
        inner = self.activation(self.input_proj(self.input_layernorm(hidden)))
        return self.output_proj(self.spatial_gating(inner, documents, cache))


def _build(config: Any, layer_number: int) -> GMLPLayer:
    kind = config.attention_kind(layer_number)
    return GMLPLayer(
        config.hidden_size,
        config.seq_length + config.soft_prompt_tokens,
        norm_builder(config.normalization, config.layernorm_epsilon),
        ACTIVATIONS[config.activation][0],
        config.settings(kind).attention_dim if kind == "amlp" else None,
    )


@torch.no_grad()
def _init(name: str, module: nn.Module) -> bool:
    """NeoX's W = 0 and b = 1 (the gate starts as the identity); the aMLP attention keeps torch's default draw."""
    if name.endswith(".spatial_gating.proj"):
        nn.init.zeros_(module.weight)
        nn.init.ones_(module.bias)
    elif name.endswith((".spatial_gating.attn.proj_qkv", ".spatial_gating.attn.proj_ffn")):
        module.reset_parameters()
    else:
        return False
    return True


def _flops(module: nn.Module, seq_length: int) -> int:
    """The spatial projection mixes each inner feature over the sequence: 6 x inner x seq_length, counted as
    attention is (not as its seq x seq weights); the tiny attention's scores and context as attention's."""
    if isinstance(module, SpatialGatingUnit):
        return 6 * module.inner * seq_length - 6 * module.proj.weight.numel()
    if isinstance(module, TinyAttention):
        return 12 * module.dim * seq_length
    return 0


def _problems(config: Any, kinds: set[str]) -> list[str]:
    dim = config.settings("amlp").attention_dim
    return [f"model.gmlp_attention_dim: expected 1 or more, found {dim}"] if "amlp" in kinds and dim < 1 else []


KINDS = tuple(
    LayerKind(
        kind,
        build=_build,
        settings=GMLPSpec,
        init=_init,
        output_projections=("output_proj",),
        tp_plan={"input_layernorm": "sequence"},
        flops=_flops,
        problems=_problems,
        splits_activation=True,
        reads_row_positions=True,
    )
    for kind in GATING_KINDS
)
"""gMLP and aMLP blocks."""
