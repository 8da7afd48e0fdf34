"""Compiled decoder blocks: each block's forward compiled with `torch.compile` (inductor on CPU and
CUDA), in place, so module and parameter names stay what checkpoints and plans expect.

Applied where torchtitan applies it: after tensor parallelism and recompute wrapping (the compiled
graph holds the DTensor collectives and the checkpointed region), before data parallelism (whose
hooks stay outside). Blocks are compiled on their first call; the first step pays for it.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn


def compile_blocks(blocks: Iterable[nn.Module]) -> int:
    """Compile each of `blocks` in place; returns how many."""
    count = 0
    for block in blocks:
        block.compile()
        count += 1
    return count
