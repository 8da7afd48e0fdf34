"""A layer kind nxd does not ship, written against nxd-models' public API alone: a depthwise causal convolution
mixer (x + out(conv(norm(x))), each channel convolved over the last `width` positions with its own filter). Importing
this module registers nothing; `KIND` is registered by whoever trains it (`register_layer_kind`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from nxd_models import LayerKind, register_layer_kind
from nxd_models import layer_kinds as registered
from torch import nn


@dataclass(frozen=True)
class ToyConvSpec:
    width: int = 3
    """Positions each channel's filter reads (the token's and the width - 1 before it)."""


class DepthwiseConvMixer(nn.Module):
    """Called as a transformer layer is; the attention arguments it has no use for are accepted and ignored."""

    def __init__(self, hidden: int, width: int, eps: float):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(hidden, eps=eps)
        self.conv = nn.Conv1d(hidden, hidden, width, groups=hidden, padding=width - 1)
        self.out_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(
        self,
        hidden: torch.Tensor,
        rotary: object = None,
        allowed: object = None,
        documents: object = None,
        cache: object = None,
        position_bias: object = None,
    ) -> torch.Tensor:
        seq = hidden.shape[1]
        mixed = self.conv(self.input_layernorm(hidden).transpose(1, 2))[..., :seq]  # causal: the left padding only
        return hidden + self.out_proj(mixed.transpose(1, 2))


def _build(config, layer_number: int) -> DepthwiseConvMixer:  # noqa: ANN001 (a GPTConfig)
    return DepthwiseConvMixer(config.hidden_size, config.settings(KIND.name).width, config.layernorm_epsilon)


def _init(name: str, module: nn.Module) -> bool:
    if name.endswith(".conv"):
        module.reset_parameters()  # torch's default draw
        return True
    return False


def _flops(module: nn.Module, seq_length: int) -> int:
    return 6 * module.conv.weight.numel() if isinstance(module, DepthwiseConvMixer) else 0


def _problems(config, kinds: set[str]) -> list[str]:  # noqa: ANN001 (a GPTConfig)
    width = config.settings(KIND.name).width
    return [] if width >= 1 else [f"model.layer_settings: a toyconv filter reads 1 or more positions, found {width}"]


KIND = LayerKind(
    "toyconv",
    build=_build,
    settings=ToyConvSpec,
    init=_init,
    output_projections=(".out_proj",),
    tp_plan={"input_layernorm": "sequence"},
    flops=_flops,
    problems=_problems,
)
SHAPE = dict(
    attention_layers=("toyconv", "dense"),
    position_embedding_type="rope",
    normalization="rmsnorm",
    layer_settings=(ToyConvSpec(width=3),),
)
"""A parity model's kinds in turn (`attention_layers` is repeated to the model's depth) and settings."""


def ensure_registered() -> None:
    """Register `KIND` in this process unless it is already."""
    if KIND.name not in {kind.name for kind in registered()}:
        register_layer_kind(KIND)
