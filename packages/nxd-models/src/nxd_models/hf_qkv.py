"""NxDT's `qkv_linear` / `fuse_qkv` for transformers models: one query/key/value module per attention.

NxDT's Hugging Face Llama computes its projections in one GQA-aware QKV module, so tensor
parallelism splits the three by heads together and `kv_replicator` replicates the key/value heads.
Here each attention layer gets nxd's `QKVLinear` as `qkv_proj`, holding the very parameters of its
q_proj / k_proj / v_proj, and transformers' own attention forward still runs: the attention
computes the three once at its start and hands each to a parameterless stand-in left under the old
name, which the forward then calls. RoPE, query/key norms (Qwen3), sliding windows and attention
functions therefore stay exactly transformers'. The choice travels with the config (`QKV_LINEAR`),
so every build of the model, on the meta device or not, has it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .qkv import QKVLinear

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

QKV_LINEAR = "nxd_qkv_linear"
"""The config attribute naming the QKV module's kind: "fused" (one matmul) or "separate" (three)."""
PROJECTIONS = ("q_proj", "k_proj", "v_proj")


def set_qkv_linear(config: PretrainedConfig, enabled: bool, fuse: bool) -> None:
    """Record NxDT's `qkv_linear` / `fuse_qkv` on `config` (never exported to config.json)."""
    if enabled:
        setattr(config, QKV_LINEAR, "fused" if fuse else "separate")
    elif hasattr(config, QKV_LINEAR):
        delattr(config, QKV_LINEAR)


def qkv_linear_of(config: PretrainedConfig) -> str | None:
    """ "fused", "separate" or None (transformers' separate q/k/v layers)."""
    return getattr(config, QKV_LINEAR, None)


class ComputedProjection(nn.Module):
    """Where transformers' attention calls q_proj, k_proj or v_proj: returns what the attention's QKV
    module computed for this call (once), so the forward reads on unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: torch.Tensor | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        value, self.pending = self.pending, None
        if value is None:
            raise RuntimeError("a q/k/v projection was called outside its attention layer's forward")
        return value


class _QKVAttention:
    """Mixed into a transformers attention class: the projections come from `qkv_proj`."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        for name, value in zip(PROJECTIONS, self.qkv_proj(hidden_states), strict=True):
            getattr(self, name).pending = value
        return super().forward(hidden_states, *args, **kwargs)


_ATTENTION_CLASSES: dict[type, type] = {}


def _with_qkv(cls: type) -> type:
    """`cls` with its projections from `qkv_proj`, under the same class name (recompute names find it)."""
    if cls not in _ATTENTION_CLASSES:
        _ATTENTION_CLASSES[cls] = type(cls.__name__, (_QKVAttention, cls), {"__qualname__": cls.__qualname__})
    return _ATTENTION_CLASSES[cls]


def use_qkv_linear(model: PreTrainedModel) -> PreTrainedModel:
    """Give every attention layer of `model` (on any device, the meta one included) a `QKVLinear` made of
    its own q/k/v parameters, as its config's `QKV_LINEAR` says; a no-op without it."""
    kind = qkv_linear_of(model.config)
    if kind is None:
        return model
    for layer in filter(None, model.model.layers):  # a pipeline stage holds some of them
        attention = layer.self_attn
        q, k, v = (getattr(attention, name) for name in PROJECTIONS)
        with torch.device("meta"):
            qkv = QKVLinear(
                q.in_features, q.out_features, k.out_features, bias=q.bias is not None, fuse=kind == "fused"
            )
        for part, linear in zip("qkv", (q, k, v), strict=True):
            qkv.register_parameter(f"weight_{part}", linear.weight)
            qkv.register_parameter(f"bias_{part}", linear.bias)
        attention.qkv_proj = qkv
        for name in PROJECTIONS:
            setattr(attention, name, ComputedProjection())
        attention.__class__ = _with_qkv(type(attention))
    return model


def hf_key(name: str) -> str:
    """transformers' key for one of our state-dict keys: the QKV module's `qkv_proj.weight_q` is
    `q_proj.weight` (likewise k, v and biases); every other key is its own."""
    head, _, leaf = name.rpartition(".qkv_proj.")
    if not head:
        return name
    kind, _, part = leaf.partition("_")
    return f"{head}.{part}_proj.{kind}"
