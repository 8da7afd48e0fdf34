"""Materialise a model that was built and sharded on the meta device.

Every rank's shards hold exactly the values of a one-process initialisation with the same seed
(the slices of it), so a run's layout never changes its starting point and checkpoints are
interchangeable between layouts. Ranks build the whole model in waves of `ranks_at_once`
(NxDT's sequential_move_factor), which bounds how many whole copies exist on a host at once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from .ties import retie, tied_parameters


@torch.no_grad()
def load_whole_weights(model: nn.Module, whole: nn.Module) -> None:
    """Copy into each (possibly sharded) parameter and buffer of `model` its part of `whole`'s value."""
    sources = dict(whole.named_parameters()) | dict(whole.named_buffers())
    targets = dict(model.named_parameters()) | dict(model.named_buffers())
    if missing := sorted(set(targets) - set(sources)):
        raise KeyError(f"the whole model lacks {missing[:5]}")
    for name, target in targets.items():
        source = sources[name]
        if isinstance(target, DTensor):
            part = distribute_tensor(source.to(target.device), target.device_mesh, target.placements,
                                     src_data_rank=None)  # local slicing, no communication
            target.to_local().copy_(part.to_local())
        else:
            target.copy_(source)


def materialise(
    model: nn.Module,
    build_whole: Callable[[], nn.Module],
    device: torch.device,
    *,
    ranks_at_once: int,
) -> nn.Module:
    """Allocate `model`'s shards on `device` and fill them from `build_whole()`, which each rank calls
    when its wave comes (it must build the same model on every rank: seed it inside)."""
    tied = tied_parameters(model)
    model.to_empty(device=device)
    retie(model, tied)  # to_empty allocates tied parameters apart
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    ranks_at_once = max(1, ranks_at_once)
    waves = -(-world // ranks_at_once)
    for wave in range(waves):
        if rank // ranks_at_once == wave:
            whole = build_whole()
            load_whole_weights(model, whole)
            del whole
        if distributed and waves > 1:
            dist.barrier()
    return model
