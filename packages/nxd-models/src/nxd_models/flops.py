"""Model FLOPs per trained token, the numerator of MFU."""

from __future__ import annotations

import re
from collections import Counter

from torch import nn

from .qkv import QKVLinear
from .rwkv import TimeMix
from .selective_state_space import STATE_SIZE, MambaMixer
from .spatial_gating import SpatialGatingUnit, TinyAttention


def training_flops_per_token(model: nn.Module, seq_length: int) -> int:
    """6 x (weights of every matmul, output layer included, embedding lookups excluded) plus the attention
    score and context matmuls, 12 x layers x attention width x seq_length (the PaLM paper's count, which
    ignores causal masking so that figures compare across frameworks). A gMLP layer's spatial projection mixes
    each of its inner features over the sequence: 6 x inner x seq_length, counted as attention is. A Mamba layer's
    convolution counts as matmul weights and its scan as three multiply-adds per channel and state; an RWKV layer's
    low-rank mixing and decay weights as matmul weights and its recurrence as two multiply-adds per state entry."""
    runs = _runs(model)
    modules = list(model.named_modules())
    spatial = {f"{name}.proj": module for name, module in modules if isinstance(module, SpatialGatingUnit)}
    matmul_weights = sum(
        runs(name) * module.weight.numel()
        for name, module in modules
        if isinstance(module, nn.Linear) and name not in spatial
    )
    fused = [(name, module) for name, module in modules if isinstance(module, QKVLinear)]
    matmul_weights += sum(
        runs(name) * (m.weight_q.numel() + m.weight_k.numel() + m.weight_v.numel()) for name, m in fused
    )
    query_widths = [
        runs(name) * module.out_features
        for name, module in modules
        if name.endswith("q_proj") and isinstance(module, nn.Linear)
    ]
    query_widths += [runs(name) * m.weight_q.shape[0] for name, m in fused]
    query_widths += [module.dim for module in model.modules() if isinstance(module, TinyAttention)]
    attention = sum(12 * width * seq_length for width in query_widths)
    attention += sum(6 * unit.inner * seq_length for unit in spatial.values())
    mixers = [(name, m) for name, m in modules if isinstance(m, MambaMixer)]
    matmul_weights += sum(runs(name) * (m.conv1d.weight.numel() + 3 * m.inner * STATE_SIZE) for name, m in mixers)
    for name, m in modules:
        if isinstance(m, TimeMix):
            low_rank = (m.time_maa_w1, m.time_maa_w2, m.time_decay_w1, m.time_decay_w2)
            matmul_weights += runs(name) * (sum(p.numel() for p in low_rank) + 2 * m.time_decay.numel() * m.head_size)
    return 6 * matmul_weights + attention


def _runs(model: nn.Module):  # noqa: ANN202
    """How many positions of the stack run the module named `name` (a shared decoder layer runs at several)."""
    config = getattr(model, "config", None)
    order = getattr(config, "layer_order", ()) if getattr(config, "shares_layers", False) else ()
    counts = Counter(order)

    def runs(name: str) -> int:
        match = re.match(r"model\.layers\.(\d+)\.", name)
        return counts[int(match.group(1))] if match and counts else 1

    return runs
