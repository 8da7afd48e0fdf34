"""The vocabulary of tensor-parallel plans (the styles a plan may name, `tensor_parallel.py` says what each does) and
the check of a plan against a model, with no DTensor import: a config check reads plans without sharding anything."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping

from torch import nn

MOE_STYLE = "moe"
"""A mixture-of-experts layer: its experts' ffn split over the tp ranks (`expert_parallel.py`), its router
replicated."""
LOW_RANK_STYLES = ("lora_a_colwise", "lora_b_colwise", "lora_b_colwise_kv", "lora_a_rowwise", "lora_b_rowwise")
"""The halves of a low-rank adapter beside a sharded base layer (`low_rank.py`)."""
STYLES = (
    "colwise",
    "colwise_kv",
    "qkv",
    "rowwise",
    "vocab",
    "colwise_output",
    "score",
    "sequence",
    "heads",
    "replicated_with_grad_allreduce",
    MOE_STYLE,
    *LOW_RANK_STYLES,
)


def check_plan(model: nn.Module, plan: Mapping[str, str]) -> list[str]:
    """Problems with a plan: unknown styles, and patterns that name no module of the model."""
    names = [name for name, _ in model.named_modules()]
    problems = [
        f"TP plan {pattern!r}: style {style!r} is not one of {', '.join(STYLES)}"
        for pattern, style in plan.items()
        if style not in STYLES
    ]
    problems += [
        f"TP plan {pattern!r}: names no module of {type(model).__name__}"
        for pattern in plan
        if not fnmatch.filter(names, pattern)
    ]
    return problems
