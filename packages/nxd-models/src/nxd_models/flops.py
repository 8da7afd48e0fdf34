"""Model FLOPs per trained token, the numerator of MFU."""

from __future__ import annotations

import re
from collections import Counter

from torch import nn

from .layer_kinds import layer_kinds
from .qkv import QKVLinear


def training_flops_per_token(model: nn.Module, seq_length: int) -> int:
    """6 x (weights of every matmul, output layer included, embedding lookups excluded) plus the attention
    score and context matmuls, 12 x layers x attention width x seq_length (the PaLM paper's count, which
    ignores causal masking so that figures compare across frameworks), plus what each layer kind counts beyond its
    linear layers (`LayerKind.flops`: a gMLP layer's spatial projection as attention, a Mamba layer's convolution
    and scan, an RWKV layer's low-rank mixing and recurrence)."""
    runs = _runs(model)
    modules = list(model.named_modules())
    matmul_weights = sum(
        runs(name) * module.weight.numel() for name, module in modules if isinstance(module, nn.Linear)
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
    attention = sum(12 * width * seq_length for width in query_widths)
    counts = dict.fromkeys(kind.flops for kind in layer_kinds() if kind.flops is not None)
    beyond = sum(runs(name) * count(module, seq_length) for count in counts for name, module in modules)
    return 6 * matmul_weights + attention + beyond


def _runs(model: nn.Module):  # noqa: ANN202
    """How many positions of the stack run the module named `name` (a shared decoder layer runs at several)."""
    config = getattr(model, "config", None)
    order = getattr(config, "layer_order", ()) if getattr(config, "shares_layers", False) else ()
    counts = Counter(order)

    def runs(name: str) -> int:
        match = re.match(r"model\.layers\.(\d+)\.", name)
        return counts[int(match.group(1))] if match and counts else 1

    return runs
