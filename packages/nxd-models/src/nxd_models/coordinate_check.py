"""muP's coordinate check (Tensor Programs V, appendix D.1), as mup's get_coord_data records it: models of growing
width train a few steps, and before each step's update every module's output is measured by its mean absolute
coordinate (l1). Under muP the sizes stay flat as the width grows; under the standard parametrisation they drift.

nxd keeps its own copy of mup's loop rather than importing mup at run time: mup's package requires torchvision,
which a user's environment may resolve against another torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

COORD_STEPS = 4
"""Steps recorded per width: GPT-NeoX's mup_coord_check trains nsteps 3 plus one (t = 1 .. 4)."""


def neox_widths(heads: int) -> list[int]:
    """GPT-NeoX's widths: num_attention_heads x 2^p for p in 2 .. 8."""
    return [heads * 2**p for p in range(2, 9)]


def coordinate_sizes(
    build: Callable[[int], nn.Module],
    widths: Iterable[int],
    batches: Sequence[Mapping[str, torch.Tensor]],
    loss: Callable[[nn.Module, Mapping[str, torch.Tensor]], torch.Tensor],
    optimizer: Callable[[nn.Module], torch.optim.Optimizer],
) -> list[dict[str, Any]]:
    """For each width a model `build(width)` trained one step per batch with `optimizer(model)`; a record (width,
    module, t, l1) per module output per step, in mup's order and names (a tuple's items as `name:out[i]`)."""
    records: list[dict[str, Any]] = []
    for width in widths:
        model = build(width).train()
        step = optimizer(model)
        for t, batch in enumerate(batches, 1):
            hooks = [
                module.register_forward_hook(_recorder(records, width, name, t))
                for name, module in model.named_modules()
            ]
            try:
                value = loss(model, batch)
                step.zero_grad()
                value.backward()
                step.step()
            finally:
                for hook in hooks:
                    hook.remove()
        del model, step
    return records


def _recorder(records: list[dict[str, Any]], width: int, name: str, t: int) -> Callable[..., None]:
    def record(module: nn.Module, inputs: Any, output: Any) -> None:
        with torch.no_grad():
            for suffix, tensor in _tensors(output, ":out" if isinstance(output, tuple | list | dict) else ""):
                records.append({"width": width, "module": name + suffix, "t": t, "l1": tensor.abs().mean().item()})

    return record


def _tensors(value: Any, prefix: str) -> Iterable[tuple[str, torch.Tensor]]:
    """The tensors of a module's output with mup's suffixes ([i] per tuple item, [key] per dict entry)."""
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, tuple | list):
        for index, item in enumerate(value):
            yield from _tensors(item, f"{prefix}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors(item, f"{prefix}[{key}]")
