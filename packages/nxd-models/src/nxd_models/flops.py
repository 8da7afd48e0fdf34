"""Model FLOPs per trained token, the numerator of MFU."""

from __future__ import annotations

from torch import nn


def training_flops_per_token(model: nn.Module, seq_length: int) -> int:
    """6 x (weights of every matmul, output layer included, embedding lookups excluded) plus the attention
    score and context matmuls, 12 x layers x attention width x seq_length (the PaLM paper's count, which
    ignores causal masking so that figures compare across frameworks)."""
    matmul_weights = sum(module.weight.numel() for module in model.modules() if isinstance(module, nn.Linear))
    attention = sum(
        12 * module.out_features * seq_length
        for name, module in model.named_modules()
        if name.endswith("q_proj") and isinstance(module, nn.Linear)
    )
    return 6 * matmul_weights + attention
