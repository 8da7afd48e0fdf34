"""Per-tensor statistics of tensors that may be DTensor shards, counted as `global_norm` counts elements: each
value is what the whole tensor gives, the same on every rank, whatever the layout."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from .norms import _sum_of_squares, local_part_and_groups


def zero_percentages(named: Mapping[str, torch.Tensor], across: ProcessGroup | None = None) -> dict[str, float]:
    """The percent of each tensor's elements that are exactly 0 (GPT-NeoX's pct_grad_zeros). `across` is a group
    whose ranks hold other tensors (pipeline stages): every rank gets all of them."""
    zeros = _summed(named, lambda local: (local == 0).sum(dtype=_wide(local.device)))
    return _everywhere({name: 100.0 * zeros[name] / tensor.numel() for name, tensor in named.items()}, across)


def tensor_norms(named: Mapping[str, torch.Tensor], across: ProcessGroup | None = None) -> dict[str, float]:
    """Each tensor's L2 norm (squares summed in fp64); `across` as for `zero_percentages`."""
    squares = _summed(named, lambda local: _sum_of_squares([local], _wide(local.device)))
    return _everywhere({name: value**0.5 for name, value in squares.items()}, across)


def _summed(named: Mapping[str, torch.Tensor], local_sum: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, float]:
    """`local_sum` of each tensor's local part, added up over the ranks that hold its other parts: one reduction
    per set of groups, not per tensor."""
    by_groups: dict[tuple, list[tuple[str, torch.Tensor]]] = defaultdict(list)
    for name, tensor in named.items():
        local, groups = local_part_and_groups(tensor)
        by_groups[groups].append((name, local))
    sums: dict[str, float] = {}
    for groups, parts in by_groups.items():
        values = torch.stack([local_sum(local) for _, local in parts])
        for group in groups:
            dist.all_reduce(values, group=group)
        sums.update(zip([name for name, _ in parts], values.tolist(), strict=True))
    return sums


def _wide(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64  # MPS has no fp64


def _everywhere(values: dict[str, float], across: ProcessGroup | None) -> dict[str, float]:
    """`values` merged with those of the other ranks of `across` (None: this rank's alone)."""
    if across is None:
        return values
    gathered: list[dict[str, float]] = [{} for _ in range(dist.get_world_size(across))]
    dist.all_gather_object(gathered, values, group=across)
    return {name: value for part in gathered for name, value in part.items()}
