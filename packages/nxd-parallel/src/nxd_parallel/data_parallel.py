"""Data parallelism on FSDP2: ZeRO-1 style sharding (`fully_shard`, parameters kept gathered between
forward and backward) or plain replication (`replicate`), composed with tensor-parallel DTensors."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


def apply_data_parallel(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    zero1: bool,
    blocks: Sequence[nn.Module] = (),
    mp_policy: MixedPrecisionPolicy | None = None,
) -> nn.Module:
    """Shard (`zero1`) or replicate `model` over the 1-D data-parallel `mesh`.

    With `zero1`, parameters, gradients and optimizer state live as 1/dp shards between steps; a
    forward all-gathers each block's parameters once and keeps them until its backward, which
    reduce-scatters the gradients. Without it every rank holds everything and gradients are
    all-reduced. Each of `blocks` (the decoder layers) is its own communication group, so the
    reductions overlap the backward. `mp_policy` is the precision seam (parameter / reduction dtypes).
    """
    policy = mp_policy or MixedPrecisionPolicy()
    for block in (*blocks, model):
        if zero1:
            fully_shard(block, mesh=mesh, reshard_after_forward=False, mp_policy=policy)
        else:
            replicate(block, mesh=mesh, mp_policy=policy)
    return model


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """Turn the gradient reduction off for the micro-batches before the last one of a step (they
    accumulate locally) and on for the last; a no-op for a model without data parallelism."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
