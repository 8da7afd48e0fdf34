"""Model FLOPs per trained token, the numerator of MFU."""

from __future__ import annotations

from torch import nn

from .qkv import QKVLinear


def training_flops_per_token(model: nn.Module, seq_length: int) -> int:
    """6 x (weights of every matmul, output layer included, embedding lookups excluded) plus the attention
    score and context matmuls, 12 x layers x attention width x seq_length (the PaLM paper's count, which
    ignores causal masking so that figures compare across frameworks)."""
    matmul_weights = sum(module.weight.numel() for module in model.modules() if isinstance(module, nn.Linear))
    fused = [module for module in model.modules() if isinstance(module, QKVLinear)]
    matmul_weights += sum(m.weight_q.numel() + m.weight_k.numel() + m.weight_v.numel() for m in fused)
    query_widths = [module.out_features for name, module in model.named_modules()
                    if name.endswith("q_proj") and isinstance(module, nn.Linear)]  # fmt: skip
    attention = sum(12 * width * seq_length for width in query_widths + [m.weight_q.shape[0] for m in fused])
    return 6 * matmul_weights + attention
