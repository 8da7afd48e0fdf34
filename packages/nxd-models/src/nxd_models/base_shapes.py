"""muP's base shapes of a Megatron-style model: which of its dimensions grow with its width (see `maximal_update`)."""

from __future__ import annotations

from dataclasses import replace

import torch

from .gpt import GPTConfig, GPTForCausalLM
from .maximal_update import base_shapes


def gpt_base_shapes(config: GPTConfig, width_scale: int) -> dict[str, list[int | None]]:
    """`config`'s model as muP's base: its shapes against a model `width_scale` times as wide (`widened`), as mup's
    make_base_shapes compares a base and a delta model."""
    base = replace(config, mup=None)
    return base_shapes(_shapes(base), _shapes(widened(base, base.hidden_size * width_scale)))


def widened(config: GPTConfig, hidden_size: int) -> GPTConfig:
    """`config` at another hidden size, the MLP and head widths the config sets scaled with it (rounded)."""
    ratio = hidden_size / config.hidden_size
    return replace(
        config,
        hidden_size=hidden_size,
        ffn_hidden_size=config.ffn_hidden_size and max(1, round(config.ffn_hidden_size * ratio)),
        kv_channels=config.kv_channels and max(1, round(config.kv_channels * ratio)),
    )


def _shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        return {name: tuple(p.shape) for name, p in GPTForCausalLM(config).named_parameters()}
