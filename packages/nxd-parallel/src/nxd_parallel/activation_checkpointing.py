"""Activation checkpointing: recompute chosen modules' activations in the backward pass.

Uses torch's composable `checkpoint`, which keeps module and parameter names unchanged (checkpoints
and plans still match) and composes with FSDP2.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn
from torch.distributed._composable import checkpoint


def apply_activation_checkpointing(modules: Iterable[nn.Module]) -> int:
    """Recompute each of `modules` in backward instead of keeping its activations; returns how many."""
    count = 0
    for module in modules:
        checkpoint(module)
        count += 1
    return count
