"""RWKV layers (RWKV-6, "Finch"), as GPT-NeoX's RWKVResidualLayer computes them.

A layer is x + time_mix(ln1(x)), then + channel_mix(ln2(.)); the first layer of the stack first replaces x with
ln1(x), as NeoX's does, and NeoX's dropout falls on each residual sum. Both mixes read the previous token through a
token shift. The time mix interpolates each of its five inputs between the token and its predecessor by learned and
data-dependent amounts (a rank-32 projection), derives a per-token decay w (a rank-64 projection), and runs the WKV
recurrence per head of `head_size` channels:

    y_t = r_t (u k_t^T v_t + S_{t-1}),    S_t = diag(exp(-exp(w_t))) S_{t-1} + k_t^T v_t,

then a group norm per head, a silu gate and the output projection. The channel mix is sigmoid(r) * value(relu(key)^2).
The recurrence is plain PyTorch in fp32 (NeoX's CUDA kernel's arithmetic, chunk by chunk: `wkv`), so it runs on every
device.
NeoX's initialisation is kept: its layer-dependent mixing and decay curves, U(+-1e-4) low-rank projections, torch's
default draw for the linear layers, and layernorms (NeoX builds nn.LayerNorm whatever `norm` says).

The layer's weights are whole on every tensor-parallel rank. Packed documents are each run as if alone (the state
and the token shift restart). Decoding recomputes the layer over the cached inputs of every earlier position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .kv_cache import LayerCache
from .layer_kinds import LayerKind

MIX_RANK, DECAY_RANK = 32, 64
"""The ranks of the time mix's data-dependent interpolation and decay (NeoX's TIME_MIX_EXTRA_DIM and
TIME_DECAY_EXTRA_DIM)."""


WKV_CHUNK = 16
"""Tokens per chunk of `wkv`'s chunked form."""


def wkv(
    r: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    starts: torch.Tensor | None = None,
    chunk: int = WKV_CHUNK,
) -> torch.Tensor:
    """The WKV recurrence (see the module docstring) in fp32, `chunk` tokens at a time: r, k, v and w (the decay's
    log-log, before exp(-exp(.))) are (batch, seq, heads, head_size), u (heads, head_size); `starts` (batch, seq) True
    where a packed document begins (the state restarts there). Returns (batch, seq, heads, head_size).

    Within a chunk every output is a sum over the chunk's earlier tokens, each weighed per key channel by the decay
    between them, exp(sum of log w over the tokens in between) <= 1, written out as a (chunk, chunk, head_size) tensor
    so that nothing overflows however strong the decay; the state enters from the chunk before and leaves for the
    next. It equals `wkv_steps` to fp32 rounding with seq / chunk Python steps instead of seq."""
    if r.shape[1] <= chunk:
        return wkv_steps(r, k, v, w, u, starts)
    batch, seq, heads, size = r.shape
    pad = -seq % chunk
    r, k, v = (F.pad(t.float(), (0, 0, 0, 0, 0, pad)).transpose(1, 2) for t in (r, k, v))  # (batch, heads, seq, size)
    log_decay = F.pad(-torch.exp(w.float()), (0, 0, 0, 0, 0, pad)).transpose(1, 2)
    documents = None if starts is None else torch.cumsum(F.pad(starts, (0, pad)).long(), dim=1)  # (batch, seq)
    bonus = u.float().unsqueeze(1)  # (heads, 1, size)
    before = torch.ones(chunk, chunk, dtype=torch.bool, device=r.device).tril(-1)  # token s before token t
    state = r.new_zeros(batch, heads, size, size)
    outputs = []
    # split, not slicing: the backward joins each input's gradient once instead of adding a zero-padded copy per chunk
    parts = zip(*(t.split(chunk, dim=2) for t in (r, k, v, log_decay)), strict=True)
    for start, (r_c, k_c, v_c, decay_c) in zip(range(0, seq + pad, chunk), parts, strict=True):
        total = torch.cumsum(decay_c, dim=2)  # through each token
        until = total - decay_c  # before each token
        allowed, reads_state, carries = before, None, None
        if documents is not None:
            doc = documents[:, start : start + chunk]  # (batch, chunk)
            entering = documents[:, start - 1 : start] if start else doc[:, :1] - 1  # the state's document
            allowed = before & (doc[:, :, None] == doc[:, None, :])[:, None]  # (batch, 1, chunk, chunk)
            reads_state = (doc == entering)[:, None, :, None].float()
            carries = (doc[:, -1:] == entering)[:, None, :, None].float()  # (batch, 1, 1, 1)
            keeps = (doc == doc[:, -1:])[:, None, :, None].float()  # tokens of the chunk's last document
        gap = (until.unsqueeze(3) - total.unsqueeze(2)).masked_fill(~allowed.unsqueeze(-1), float("-inf"))
        scores = torch.einsum("bhtk,bhsk,bhtsk->bhts", r_c, k_c, torch.exp(gap))
        from_state = (r_c * torch.exp(until)) @ state
        out = scores @ v_c + (r_c * bonus * k_c).sum(-1, keepdim=True) * v_c
        out = out + (from_state if reads_state is None else from_state * reads_state)
        outputs.append(out)
        to_end = k_c * torch.exp(total[:, :, -1:] - total)
        if documents is not None:
            to_end, state = to_end * keeps, state * carries
        state = torch.exp(total[:, :, -1]).unsqueeze(-1) * state + to_end.transpose(-1, -2) @ v_c
    return torch.cat(outputs, dim=2)[:, :, :seq].transpose(1, 2)


def wkv_steps(
    r: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """`wkv` one token at a time, as NeoX's CUDA kernel runs it (short sequences, and the chunked form's reference)."""
    r, k, v, decay = r.float(), k.float(), v.float(), torch.exp(-torch.exp(w.float()))
    state = r.new_zeros(r.shape[0], r.shape[2], r.shape[3], r.shape[3])  # (batch, heads, key, value)
    keep = None if starts is None else (~starts).float().unbind(1)
    bonus = u.float().unsqueeze(-1)
    outputs = []
    # unbind, not indexing: the backward stacks each input's gradient once instead of once per step
    for step, (r_t, k_t, v_t, decay_t) in enumerate(
        zip(r.unbind(1), k.unbind(1), v.unbind(1), decay.unbind(1), strict=True)
    ):
        if keep is not None:
            state = state * keep[step][:, None, None, None]
        kv = k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
        outputs.append(torch.einsum("bhk,bhkv->bhv", r_t, bonus * kv + state))
        state = decay_t.unsqueeze(-1) * state + kv
    return torch.stack(outputs, dim=1)


def _shifted(x: torch.Tensor, starts: torch.Tensor | None) -> torch.Tensor:
    """Each token's predecessor (zero for the first, and for a packed document's first)."""
    previous = F.pad(x, (0, 0, 1, -1))
    return previous if starts is None else previous * (~starts).unsqueeze(-1)


def _curve(width: int, power: float) -> torch.Tensor:
    """1 - (i / width) ** power for each channel i (NeoX's interpolation curves)."""
    return 1.0 - torch.pow(torch.arange(width, dtype=torch.float32) / width, power).view(1, 1, width)


class TimeMix(nn.Module):
    """RWKV-6's substitute for attention (NeoX's RWKV_TimeMix)."""

    def __init__(self, hidden: int, dim_att: int, heads: int, layer: int, layers: int):
        super().__init__()
        self.heads, self.head_size = heads, dim_att // heads
        self.layer, self.layers = layer, layers
        for name in ("x", "w", "k", "v", "r", "g"):
            self.register_parameter(f"time_maa_{name}", nn.Parameter(torch.empty(1, 1, hidden)))
        self.time_maa_w1 = nn.Parameter(torch.empty(hidden, MIX_RANK * 5))
        self.time_maa_w2 = nn.Parameter(torch.empty(5, MIX_RANK, hidden))
        self.time_decay = nn.Parameter(torch.empty(1, 1, dim_att))
        self.time_decay_w1 = nn.Parameter(torch.empty(hidden, DECAY_RANK))
        self.time_decay_w2 = nn.Parameter(torch.empty(DECAY_RANK, dim_att))
        self.time_faaaa = nn.Parameter(torch.empty(heads, self.head_size))
        self.receptance, self.key, self.value, self.gate = (nn.Linear(hidden, dim_att, bias=False) for _ in range(4))
        self.output = nn.Linear(dim_att, hidden, bias=False)
        self.ln_x = nn.GroupNorm(heads, dim_att, eps=1e-5 * 8**2)

    def forward(self, x: torch.Tensor, starts: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq, hidden = x.shape
        xx = _shifted(x, starts) - x
        mixed = torch.tanh((x + xx * self.time_maa_x) @ self.time_maa_w1).view(batch * seq, 5, -1).transpose(0, 1)
        mw, mk, mv, mr, mg = torch.bmm(mixed, self.time_maa_w2).view(5, batch, seq, hidden).unbind(0)
        xw, xk, xv, xr, xg = (
            x + xx * (getattr(self, f"time_maa_{name}") + m)
            for name, m in zip("wkvrg", (mw, mk, mv, mr, mg), strict=True)
        )
        r, k, v = self.receptance(xr), self.key(xk), self.value(xv)
        g = F.silu(self.gate(xg))
        w = self.time_decay + torch.tanh(xw @ self.time_decay_w1) @ self.time_decay_w2
        heads = (batch, seq, self.heads, self.head_size)
        y = wkv(r.view(heads), k.view(heads), v.view(heads), w.view(heads), self.time_faaaa, starts)
        y = self.ln_x(y.reshape(batch * seq, -1).to(x.dtype)).view(batch, seq, -1)
        return self.output(y * g)

    @torch.no_grad()
    def reset_curves(self) -> None:
        """NeoX's start of the mixing amounts, decay speeds and bonus u, by the layer's place in the stack."""
        layer, layers = self.layer, self.layers
        ratio_0_to_1, ratio_1_to_almost_0 = layer / max(layers - 1, 1), 1.0 - layer / layers
        hidden, dim_att = self.time_maa_x.shape[-1], self.time_decay.shape[-1]
        for name in ("x", "w", "k"):
            getattr(self, f"time_maa_{name}").copy_(_curve(hidden, ratio_1_to_almost_0))
        self.time_maa_v.copy_(_curve(hidden, ratio_1_to_almost_0) - 0.3 * ratio_0_to_1)
        self.time_maa_r.copy_(_curve(hidden, 0.5 * ratio_1_to_almost_0))
        self.time_maa_g.copy_(_curve(hidden, 0.5 * ratio_1_to_almost_0))
        for low_rank in (self.time_maa_w1, self.time_maa_w2, self.time_decay_w1, self.time_decay_w2):
            nn.init.uniform_(low_rank, -1e-4, 1e-4)
        n = torch.arange(dim_att, dtype=torch.float32) / max(dim_att - 1, 1)
        self.time_decay.copy_((-6 + 5 * n ** (0.7 + 1.3 * ratio_0_to_1)).view(1, 1, dim_att))
        zigzag = ((torch.arange(dim_att) + 1) % 3 - 1) * 0.1
        self.time_faaaa.copy_((ratio_0_to_1 * (1 - n) + zigzag).view_as(self.time_faaaa))


class ChannelMix(nn.Module):
    """RWKV's feed-forward (NeoX's RWKV_ChannelMix): sigmoid(receptance(xr)) * value(relu(key(xk))^2)."""

    def __init__(self, hidden: int, ffn: int, layer: int, layers: int):
        super().__init__()
        self.layer, self.layers = layer, layers
        self.time_maa_k = nn.Parameter(torch.empty(1, 1, hidden))
        self.time_maa_r = nn.Parameter(torch.empty(1, 1, hidden))
        self.key = nn.Linear(hidden, ffn, bias=False)
        self.receptance = nn.Linear(hidden, hidden, bias=False)
        self.value = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor, starts: torch.Tensor | None = None) -> torch.Tensor:
        xx = _shifted(x, starts) - x
        k = torch.relu(self.key(x + xx * self.time_maa_k)) ** 2
        return torch.sigmoid(self.receptance(x + xx * self.time_maa_r)) * self.value(k)

    @torch.no_grad()
    def reset_curves(self) -> None:
        """NeoX's start of the mixing amounts, by the layer's place in the stack."""
        curve = _curve(self.time_maa_k.shape[-1], 1.0 - self.layer / self.layers)
        self.time_maa_k.copy_(curve)
        self.time_maa_r.copy_(curve)


class RWKVLayer(nn.Module):
    """NeoX's RWKVResidualLayer; called as a `DecoderLayer` is (the arguments of attention it has no use for are
    accepted and ignored). `layer` is 0-based."""

    def __init__(
        self,
        hidden: int,
        dim_att: int,
        heads: int,
        ffn: int,
        layer: int,
        layers: int,
        attention_dropout: float,
        hidden_dropout: float,
    ):
        super().__init__()
        self.layer = layer
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.att = TimeMix(hidden, dim_att, heads, layer, layers)
        self.ffn = ChannelMix(hidden, ffn, layer, layers)
        self.drop0, self.drop1 = nn.Dropout(attention_dropout), nn.Dropout(hidden_dropout)

    @property
    def kept_per_token(self) -> int:
        """Activations the backward keeps a token, about (memory plans): the time mix's shifted and mixed inputs,
        r, k, v, g, w and its output (~12 x dim_att), the state of every head at every step (head_size x dim_att),
        and the channel mix's key before and after its activation."""
        dim_att, head_size = self.att.time_decay.shape[-1], self.att.head_size
        return (12 + head_size) * dim_att + 2 * self.ffn.key.out_features

    def forward(
        self,
        hidden: torch.Tensor,
        rotary: object = None,
        allowed: object = None,
        documents: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        position_bias: object = None,
    ) -> torch.Tensor:
        if cache is None:
            return self._mix(hidden, documents)
        seq = hidden.shape[1]  # decoding: the layer over every cached position, this call's outputs kept
        everything, _ = cache.extend(hidden.unsqueeze(1), hidden.new_empty(hidden.shape[0], 1, seq, 0))
        return self._mix(everything.squeeze(1), None)[:, -seq:]

    def _mix(self, x: torch.Tensor, documents: torch.Tensor | None) -> torch.Tensor:
        starts = None if documents is None else documents != F.pad(documents, (1, 0), value=-2)[:, :-1]
        if self.layer == 0:  # NeoX's first layer normalises its input with ln1 before the residual stream starts
            x = self.ln1(x)
        x = self.drop0(x + self.att(self.ln1(x), starts))
        return self.drop1(x + self.ffn(self.ln2(x), starts))


@dataclass(frozen=True)
class RWKVSpec:
    """The settings of rwkv layers (GPT-NeoX's)."""

    dim_att: int | None = None
    """The width of the time mix, num_attention_heads heads of it (None: hidden_size; NeoX's dim_att)."""
    ffn_size: int | None = None
    """The width of the channel mix (None: 3.5 x hidden_size rounded down to a multiple of 32, as NeoX's ffn_dim)."""

    def width(self, hidden: int) -> int:
        return self.dim_att or hidden

    def ffn(self, hidden: int) -> int:
        return self.ffn_size or int(3.5 * hidden) // 32 * 32


def _build(config: Any, layer_number: int) -> RWKVLayer:
    spec, hidden = config.settings("rwkv"), config.hidden_size
    return RWKVLayer(
        hidden,
        spec.width(hidden),
        config.num_attention_heads,
        spec.ffn(hidden),
        layer_number - 1,
        config.num_layers,
        config.attention_dropout,
        config.hidden_dropout,
    )


_TORCH_DRAWN = (
    *(f".att.{name}" for name in ("receptance", "key", "value", "gate", "output")),
    *(f".ffn.{name}" for name in ("key", "receptance", "value")),
)
"""NeoX leaves the linear layers of both mixes to torch's default draw."""


@torch.no_grad()
def _init(name: str, module: nn.Module) -> bool:
    """NeoX's curves for the layer's place in the stack; its linear layers keep torch's default draw."""
    if isinstance(module, TimeMix | ChannelMix):
        module.reset_curves()
    elif name.endswith(_TORCH_DRAWN):
        module.reset_parameters()
    else:
        return False
    return True


def _flops(module: nn.Module, seq_length: int) -> int:
    """The low-rank mixing and decay weights as matmul weights, the recurrence as two multiply-adds per state
    entry."""
    if isinstance(module, TimeMix):
        low_rank = (module.time_maa_w1, module.time_maa_w2, module.time_decay_w1, module.time_decay_w2)
        return 6 * (sum(p.numel() for p in low_rank) + 2 * module.time_decay.numel() * module.head_size)
    return 0


def _problems(config: Any, kinds: set[str]) -> list[str]:
    width, heads = config.settings("rwkv").width(config.hidden_size), config.num_attention_heads
    if width % heads:
        return [
            f"model.rwkv_dim_att: an rwkv layer's time mix has num_attention_heads heads; expected a multiple of "
            f"{heads}, found {width}"
        ]
    return []


KINDS = (LayerKind("rwkv", build=_build, settings=RWKVSpec, init=_init, flops=_flops, problems=_problems, scans=True),)
"""The RWKV-6 block."""
