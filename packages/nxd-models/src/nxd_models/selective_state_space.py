"""Mamba layers (Gu and Dao 2023, the selective state-space block), as GPT-NeoX's ParallelMambaResidualLayer
computes them: x + mixer(norm(x)).

The mixer projects to two halves (x, z) of `inner` channels each, runs x through a causal depthwise convolution of
width 4 and silu, derives each token's step size, B and C from it (x_proj, then dt_proj up to `inner`), and scans

    h_t = exp(delta_t A) h_{t-1} + delta_t B_t x_t,    y_t = C_t h_t + D x_t,

with delta_t = softplus(dt_t + dt_bias) and A = -exp(A_log) (16 states per channel), then returns
out_proj(y * silu(z)). The scan is plain PyTorch over the sequence in fp32 (mamba-ssm's selective_scan_ref), so it
runs on every device; on CUDA, where mamba-ssm is installed, its fused selective-scan kernel computes the same scan
in fp32 instead (not for packed documents, whose restarts the kernel cannot make). NeoX's initialisation is kept:
S4D-real A, D = 1, dt's bias the inverse softplus of steps drawn log-uniformly in [0.001, 0.1], dt_proj's weight
U(+-dt_rank^-0.5), the convolution torch's default draw.

A_log and D take no weight decay in NeoX; nxd decays parameters of two or more dimensions, so A_log is kept flat
(inner x 16 values) and shaped in the forward. The layer's weights are whole on every tensor-parallel rank. Packed
documents are each scanned as if alone (the state restarts and the convolution reads no other document). Decoding
recomputes the scan over the cached inputs of every earlier position.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .kv_cache import LayerCache
from .layer_kinds import LayerKind
from .norms import norm_builder

STATE_SIZE = 16
"""States per channel (GPT-NeoX's d_state)."""
CONVOLUTION_WIDTH = 4
"""The causal convolution's width (GPT-NeoX's d_conv)."""
DT_MIN, DT_MAX, DT_FLOOR = 0.001, 0.1, 1e-4
"""The range of the initial step sizes and their floor (mamba-ssm's defaults, as NeoX draws them)."""


@dataclass(frozen=True)
class MambaSpec:
    """The settings of mamba layers (GPT-NeoX's)."""

    inner_size: int | None = None
    """The channels of a mamba layer (None: 2 x hidden_size)."""
    conv_bias: bool = True
    """A bias on the convolution (GPT-NeoX's mamba_use_bias_in_conv)."""
    linear_bias: bool = False
    """Biases on the in, x and out projections (GPT-NeoX's mamba_use_bias_in_linears)."""


def selective_scan(
    x: torch.Tensor,
    delta: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    z: torch.Tensor,
    starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """y * silu(z) of the recurrence in the module docstring, in fp32: x, delta (already softplus'ed) and z are
    (batch, inner, seq), a (inner, state), b and c (batch, state, seq), d (inner,); `starts` (batch, seq) True where a
    packed document begins (the state starts from zero there)."""
    x, delta, b, c = x.float(), delta.float(), b.float(), c.float()
    if starts is None and x.is_cuda and (kernel := _fused_scan()) is not None:
        return kernel(x, delta, a.float(), b, c, d.float(), z.float(), delta_softplus=False)
    decay = torch.exp(delta.unsqueeze(-1) * a.unsqueeze(1))  # (batch, inner, seq, state)
    if starts is not None:
        decay = decay * (~starts)[:, None, :, None]
    drive = (delta * x).unsqueeze(-1) * b.transpose(1, 2).unsqueeze(1)
    state = x.new_zeros(x.shape[0], x.shape[1], a.shape[-1])
    outputs = []
    # unbind, not indexing: the backward then stacks each input's gradient once, where indexing would build a
    # zero-filled gradient of the whole (batch, inner, seq, state) tensor at every step
    for step_decay, step_drive, step_c in zip(decay.unbind(2), drive.unbind(2), c.unbind(-1), strict=True):
        state = step_decay * state + step_drive
        outputs.append(torch.einsum("bdn,bn->bd", state, step_c))
    y = torch.stack(outputs, dim=-1) + x * d.float()[:, None]
    return y * F.silu(z.float())


@functools.cache
def _fused_scan() -> Callable[..., torch.Tensor] | None:
    """mamba-ssm's selective_scan_fn (its CUDA kernel, y * silu(z) of the same recurrence), or None where mamba-ssm
    is not installed."""
    try:
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    except ImportError:
        return None
    return selective_scan_fn


class MambaMixer(nn.Module):
    """The Mamba block between the norm and the residual (GPT-NeoX's ParallelMambaBlock)."""

    def __init__(self, hidden: int, inner: int, conv_bias: bool, linear_bias: bool):
        super().__init__()
        self.inner, self.dt_rank = inner, math.ceil(hidden / 16)
        self.in_proj = nn.Linear(hidden, 2 * inner, bias=linear_bias)
        self.conv1d = nn.Conv1d(
            inner, inner, CONVOLUTION_WIDTH, groups=inner, padding=CONVOLUTION_WIDTH - 1, bias=conv_bias
        )
        self.x_proj = nn.Linear(inner, self.dt_rank + 2 * STATE_SIZE, bias=linear_bias)
        self.dt_proj = nn.Linear(self.dt_rank, inner)
        self.A_log = nn.Parameter(torch.empty(inner * STATE_SIZE))
        self.D = nn.Parameter(torch.empty(inner))
        self.out_proj = nn.Linear(inner, hidden, bias=linear_bias)

    def forward(self, hidden: torch.Tensor, documents: torch.Tensor | None = None) -> torch.Tensor:
        """(batch, seq, hidden) -> the same shape; with `documents` (batch, seq) each packed document is scanned as
        if alone."""
        seq = hidden.shape[1]
        x, z = self.in_proj(hidden).transpose(1, 2).chunk(2, dim=1)  # (batch, inner, seq) each
        x = F.silu(self.conv1d(x)[..., :seq] if documents is None else self._convolve_within(x, documents))
        dt, b, c = self.x_proj(x.transpose(1, 2)).split([self.dt_rank, STATE_SIZE, STATE_SIZE], dim=-1)
        delta = F.softplus((dt @ self.dt_proj.weight.T).float() + self.dt_proj.bias.float()).transpose(1, 2)
        a = -torch.exp(self.A_log.float()).view(self.inner, STATE_SIZE)
        starts = None if documents is None else documents != F.pad(documents, (1, 0), value=-2)[:, :-1]
        y = selective_scan(x, delta, a, b.transpose(1, 2), c.transpose(1, 2), self.D, z, starts)
        return self.out_proj(y.to(hidden.dtype).transpose(1, 2))

    def _convolve_within(self, x: torch.Tensor, documents: torch.Tensor) -> torch.Tensor:
        """The causal convolution with the inputs of other documents left out (as zeros, the padding's value)."""
        width = CONVOLUTION_WIDTH
        windows = F.pad(x, (width - 1, 0)).unfold(-1, width, 1)  # (batch, inner, seq, width): t - 3 .. t
        sources = F.pad(documents, (width - 1, 0), value=-2).unfold(-1, width, 1)  # (batch, seq, width)
        windows = windows * (sources == documents.unsqueeze(-1)).unsqueeze(1)
        out = (windows * self.conv1d.weight.squeeze(1)[None, :, None, :]).sum(-1)
        return out if self.conv1d.bias is None else out + self.conv1d.bias[None, :, None]


@torch.no_grad()
def init_mamba_part(name: str, module: nn.Module) -> bool:
    """GPT-NeoX's draw of the Mamba parts it initialises itself, for the module named `name` (its own tensors); False
    for a module that is none of them (the projections take the model's init methods)."""
    if isinstance(module, MambaMixer):  # S4D-real A and D = 1
        module.A_log.copy_(torch.log(torch.arange(1, STATE_SIZE + 1, dtype=torch.float32)).repeat(module.inner))
        module.D.fill_(1.0)
    elif name.endswith(".mixer.conv1d"):
        module.reset_parameters()
    elif name.endswith(".mixer.dt_proj"):
        rank, inner = module.in_features, module.out_features
        nn.init.uniform_(module.weight, -(rank**-0.5), rank**-0.5)
        steps = torch.exp(torch.rand(inner) * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN))
        steps = steps.clamp(min=DT_FLOOR)
        module.bias.copy_(steps + torch.log(-torch.expm1(-steps)))  # softplus's inverse
    else:
        return False
    return True


class MambaLayer(nn.Module):
    """x + mixer(norm(x)) (GPT-NeoX's ParallelMambaResidualLayer); called as a `DecoderLayer` is (the arguments of
    attention it has no use for are accepted and ignored)."""

    def __init__(self, hidden: int, inner: int, norm: Callable[[int], nn.Module], conv_bias: bool, linear_bias: bool):
        super().__init__()
        self.input_layernorm = norm(hidden)
        self.mixer = MambaMixer(hidden, inner, conv_bias, linear_bias)

    @property
    def kept_per_token(self) -> int:
        """Activations the backward keeps a token, about (memory plans): the projections, convolution and gate (~6
        a channel) and the PyTorch scan's decay, drive and state (3 x 16 fp32 values a channel). mamba-ssm's kernel,
        where it scans, keeps only its inputs, so the plan is high by up to 9x there."""
        return 54 * self.mixer.inner

    def forward(
        self,
        hidden: torch.Tensor,
        rotary: object = None,
        allowed: object = None,
        documents: torch.Tensor | None = None,
        cache: LayerCache | None = None,
        position_bias: object = None,
    ) -> torch.Tensor:
        normed = self.input_layernorm(hidden)
        if cache is None:
            return hidden + self.mixer(normed, documents)
        seq = normed.shape[1]  # decoding: the scan over every cached position, this call's outputs kept
        everything, _ = cache.extend(normed.unsqueeze(1), normed.new_empty(normed.shape[0], 1, seq, 0))
        return hidden + self.mixer(everything.squeeze(1))[:, -seq:]


def _build(config: Any, layer_number: int) -> MambaLayer:
    spec = config.settings("mamba")
    norm = norm_builder(config.normalization, config.layernorm_epsilon)
    return MambaLayer(
        config.hidden_size, spec.inner_size or 2 * config.hidden_size, norm, spec.conv_bias, spec.linear_bias
    )


def _flops(module: nn.Module, seq_length: int) -> int:
    """The convolution as matmul weights, the scan as three multiply-adds per channel and state."""
    if isinstance(module, MambaMixer):
        return 6 * (module.conv1d.weight.numel() + 3 * module.inner * STATE_SIZE)
    return 0


KINDS = (
    LayerKind(
        "mamba",
        build=_build,
        settings=MambaSpec,
        init=init_mamba_part,
        output_projections=(".mixer.out_proj",),
        tp_plan={"input_layernorm": "sequence"},
        flops=_flops,
        scans=True,
    ),
)
"""The Mamba block."""
