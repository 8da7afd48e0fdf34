"""Data parallelism on FSDP2: ZeRO-1 style sharding (`fully_shard`, parameters kept gathered between
forward and backward), ZeRO-3 (each block's parameters gathered for its forward and again for its backward),
either with the shards in host memory (CPU offload), or plain replication (`replicate`), composed with
tensor-parallel DTensors."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard


def apply_data_parallel(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    zero1: bool,
    zero3: bool = False,
    cpu_offload: bool = False,
    blocks: Sequence[nn.Module] = (),
    mp_policy: MixedPrecisionPolicy | None = None,
    experts: Sequence[nn.Module] = (),
    experts_mesh: DeviceMesh | None = None,
) -> nn.Module:
    """Shard (`zero1`) or replicate `model` over the 1-D data-parallel `mesh`.

    With `zero1`, parameters, gradients and optimizer state live as 1/dp shards between steps; a
    forward all-gathers each block's parameters once and keeps them until its backward, which
    reduce-scatters the gradients. With `zero3` too, each of `blocks` frees its gathered parameters after its
    forward and gathers them again for its backward (the root's stay gathered: the backward begins with them).
    With `cpu_offload` too, the shards (parameters, gradients, so the optimizer state and step) live in host
    memory; the gathered parameters are copied to the device for computing (FSDP2's CPUOffloadPolicy, pinned
    on CUDA). Without `zero1` every rank holds everything and gradients are all-reduced. Each of `blocks` (the decoder
    layers) is its own communication group, so the reductions overlap the backward. `mp_policy` is the
    precision seam (parameter / reduction dtypes).

    `experts` (mixture-of-experts modules split over expert-parallel ranks) are data-parallel over
    `experts_mesh` only, the ranks holding the same experts; with none, their gradients need no
    reduction (each rank's experts saw every token routed to them) and data parallelism leaves them be.
    """
    policy = mp_policy or MixedPrecisionPolicy()
    offload = CPUOffloadPolicy(pin_memory=mesh.device_type == "cuda") if cpu_offload else OffloadPolicy()
    ignored = set()
    for module in experts:
        if experts_mesh is not None:
            _apply(module, experts_mesh, zero1, policy, set(), offload)
        else:
            ignored |= set(module.parameters())
    for block in blocks:
        _apply(block, mesh, zero1, policy, ignored, offload, reshard=zero3)
    _apply(model, mesh, zero1, policy, ignored, offload)
    return model


def _apply(
    module: nn.Module,
    mesh: DeviceMesh,
    zero1: bool,
    policy: MixedPrecisionPolicy,
    ignored: set[nn.Parameter],
    offload: OffloadPolicy,
    reshard: bool = False,
) -> None:
    if zero1:
        fully_shard(
            module,
            mesh=mesh,
            reshard_after_forward=reshard,
            mp_policy=policy,
            ignored_params=ignored or None,
            offload_policy=offload,
        )
    else:
        replicate(module, mesh=mesh, mp_policy=policy, ignored_params=ignored or None)


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """Turn the gradient reduction off for the micro-batches before the last one of a step (they
    accumulate locally) and on for the last; a no-op for a model without data parallelism."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
