"""Every pipeline stage's weights in one whole model on each pipeline rank, for work that needs the whole model on
every rank: online RL samples its completions token by token with a key/value cache, which a pipeline schedule does
not run. The whole model is tensor-parallel as the stages are (each rank keeps its tensor-parallel share) and has no
data-parallel wrapper; `refresh` copies the stages' current values in: each tensor is gathered where its stage lives
(out of ZeRO's data-parallel shards too) and sent over the pipeline group. It costs one whole model's memory a rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .dims import ParallelMesh
from .parallelize import (
    Layout,
    PrepareParameters,
    ShardableModel,
    StagedModel,
    _keep_dtypes,
    _materialised,
    pipeline_ranges,
    shard_tensor_parallel,
)


class GatheredStages:
    """The whole model beside a rank's pipeline stages (module docstring)."""

    def __init__(
        self,
        family: ShardableModel,
        layout: Layout,
        mesh: ParallelMesh,
        device: torch.device,
        *,
        seed: int,
        prepare: PrepareParameters | None = None,
    ):
        """`family`, `layout`, `mesh`, `seed` and `prepare` as the stages were built with
        (`build_parallel_model`)."""
        prepare = prepare or _keep_dtypes
        pp = mesh.get("pp")
        if pp is None:
            raise ValueError("gathered stages: expected a pipeline-parallel mesh")
        self.group = pp.get_group()
        ranges = pipeline_ranges(family, family.build_on_meta(), layout, pp.size())
        self.owners: dict[str, int] = {}
        """Each state entry's pipeline rank (the one holding its stage)."""
        for number, layers in enumerate(ranges):
            stage = family.keep_pipeline_stage(
                family.build_on_meta(), layers, first=number == 0, last=number == len(ranges) - 1
            )
            owner = dist.get_global_rank(self.group, number % pp.size())  # rank_stages: a rank's are pp apart
            self.owners |= {name: owner for name in stage.state_dict()}
        model = family.build_on_meta()
        prepare(model, cast=True)
        shard_tensor_parallel(model, family, layout, mesh.get("tp"), prepare, sequence_parallel=False)
        self.model = _materialised(  # the entries the stages send are allocated only
            model,
            values=lambda names: family.initial_values(seed=seed, device=torch.device("cpu"), names=names),
            device=device,
            layout=layout,
            prepare=prepare,
            loaded=self.owners,
        )

    @torch.no_grad()
    def refresh(self, stages: StagedModel) -> nn.Module:
        """The whole model with the stages' current values (every rank of the pipeline group calls it)."""
        from torch.distributed.tensor import DTensor

        from .materialise import copy_part

        mine, rank = stages.state_dict(), dist.get_rank()
        targets = dict(self.model.named_parameters()) | dict(self.model.named_buffers())
        for name, owner in self.owners.items():
            target = targets[name]
            if owner == rank:
                if name not in mine:
                    raise KeyError(f"gathered stages: this rank's stages hold no {name!r}, which their meta build has")
                value = mine[name]
                whole = value.full_tensor() if isinstance(value, DTensor) else value  # offloaded shards: on the host
                whole = whole.to(device=target.device, dtype=target.dtype, copy=True)
            else:
                whole = torch.empty(target.shape, dtype=target.dtype, device=target.device)
            dist.broadcast(whole, src=owner, group=self.group)
            copy_part(target, whole)
        return self.model
