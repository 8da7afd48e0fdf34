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


def modules_of_classes(model: nn.Module, class_names: Iterable[str]) -> tuple[list[nn.Module], list[str]]:
    """The modules of `model` whose class is named in `class_names`, and the names no module has."""
    wanted = set(class_names)
    found = [module for module in model.modules() if type(module).__name__ in wanted]
    present = {type(module).__name__ for module in found}
    return found, sorted(wanted - present)
