"""Materialise a model that was built and sharded on the meta device.

Every rank's shards hold exactly the values of a one-process initialisation with the same seed
(the slices of it), so a run's layout never changes its starting point and checkpoints are
interchangeable between layouts. The family initialises the whole model one module at a time
(`InitialValues`); a rank takes the modules it holds, slices each and drops it, so it never holds
more than its shards and one module. Ranks stage their initialisation in waves of `ranks_at_once`
(NxDT's sequential_move_factor), which bounds how many ranks of a host stage tensors at once.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from .ties import retie, tied_parameters

InitialValues = Callable[[Collection[str]], Iterable[tuple[str, torch.Tensor]]]
"""`values(names)`: the whole model's initial tensors (name, whole value) of at least the modules that
own `names`, one at a time."""


@torch.no_grad()
def copy_part(target: torch.Tensor, source: torch.Tensor) -> None:
    """Copy into `target` (a parameter or buffer, possibly a DTensor shard) its part of the whole `source`,
    read in place where the part is one box of it (no copy of the part is made first). A whole target
    of the source's dtype and device takes the source's storage instead (its own was never written, so
    it held no memory), so one process never holds a module twice."""
    if not isinstance(target, DTensor):
        if (target.shape, target.dtype, target.device) == (source.shape, source.dtype, source.device):
            target.data = source
        else:
            target.copy_(source)
    elif all(type(placement) in (Shard, Replicate) for placement in target.placements):
        size, offset = compute_local_shape_and_global_offset(target.shape, target.device_mesh, target.placements)
        target.to_local().copy_(source[tuple(slice(o, o + n) for o, n in zip(offset, size, strict=True))])
    else:  # FSDP2's strided shards under tensor parallelism: local slicing, no communication
        part = distribute_tensor(source.to(target.device), target.device_mesh, target.placements, src_data_rank=None)
        target.to_local().copy_(part.to_local())


def materialise(
    model: nn.Module, values: InitialValues, device: torch.device, *, ranks_at_once: int, loaded: Collection[str] = ()
) -> nn.Module:
    """Allocate `model`'s shards on `device` and fill them from `values` (the same seeded values on
    every rank), this rank's wave at a time; the tensors named in `loaded` (filled by the caller next)
    are allocated only."""
    tied = tied_parameters(model)
    model.to_empty(device=device)
    retie(model, tied)  # to_empty allocates tied parameters apart
    targets = {
        name: tensor
        for name, tensor in (dict(model.named_parameters()) | dict(model.named_buffers())).items()
        if name not in loaded
    }
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    ranks_at_once = max(1, ranks_at_once)
    waves = -(-world // ranks_at_once)
    for wave in range(waves):
        if rank // ranks_at_once == wave and targets:
            filled = set()
            for name, value in values(targets.keys()):
                if name in targets:
                    copy_part(targets[name], value)
                    filled.add(name)
            if missing := sorted(set(targets) - filled):
                raise KeyError(f"the initialisation gave no value for {missing[:5]}")
        if distributed and waves > 1:
            dist.barrier()
    return model
