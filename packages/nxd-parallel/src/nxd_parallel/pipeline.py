"""Pipeline parallelism on `torch.distributed.pipelining`: where the stages cut a stack of layers,
which stages a rank holds, and the schedule that runs them.

Stages are cut at explicit layer numbers (NxD's `pipeline_cuts`: the named layer is the last of its
stage) or balanced automatically: contiguous runs of layers whose costs (the first stage also pays
for the embeddings, the last for the output layer) make the most expensive stage as cheap as
possible. With `virtual` stages per rank, rank r holds stages r, r + pp, r + 2pp, ... and the
interleaved 1F1B schedule runs them; otherwise 1F1B. Gradients are summed over micro-batches (the
loss function normalises by the global token count), never averaged by the schedule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed import ProcessGroup

from .errors import ParallelConfigError

if TYPE_CHECKING:  # torch.distributed.pipelining imports torch._dynamo: loaded when a schedule is built
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle


def stage_ranges(
    num_layers: int,
    stages: int,
    *,
    cuts: Sequence[int] | None = None,
    layer_cost: float = 1.0,
    first_cost: float = 0.0,
    last_cost: float = 0.0,
) -> list[range]:
    """The layers of each of `stages` stages: after the layers numbered in `cuts` (stages - 1 of them,
    increasing), or balanced by cost when `cuts` is None. Every stage gets at least one layer."""
    if stages > num_layers:
        raise ParallelConfigError(f"{stages} pipeline stages need at least as many layers, found {num_layers}")
    if cuts is None:
        return _balanced(num_layers, stages, layer_cost, first_cost, last_cost)
    cuts = list(cuts)
    problems = []
    if len(cuts) != stages - 1:
        problems.append(f"expected {stages - 1} cut(s) for {stages} stages, found {len(cuts)}")
    if any(not 0 <= cut < num_layers - 1 for cut in cuts):
        problems.append(
            f"expected cuts after layers 0 to {num_layers - 2} (the last layer ends the last stage), found {cuts}"
        )
    if any(b <= a for a, b in zip(cuts, cuts[1:], strict=False)):
        problems.append(f"expected strictly increasing cuts, found {cuts}")
    if problems:
        raise ParallelConfigError(*problems)
    bounds = [0, *(cut + 1 for cut in cuts), num_layers]
    return [range(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]


def _balanced(num_layers: int, stages: int, layer: float, first: float, last: float) -> list[range]:
    """Contiguous stages minimising the largest stage cost (dynamic programming over split points);
    ties go to the earliest split, which keeps a uniform stack evenly split."""

    def cost(start: int, end: int, stage: int) -> float:
        return (end - start) * layer + (first if stage == 0 else 0.0) + (last if stage == stages - 1 else 0.0)

    best = {(0, 0): (0.0, None)}  # (stages used, layers covered) -> (largest cost so far, previous split)
    for stage in range(stages):
        for end in range(stage + 1, num_layers - (stages - stage - 1) + 1):
            options = [
                (max(best[(stage, start)][0], cost(start, end, stage)), start)
                for start in range(stage, end)
                if (stage, start) in best
            ]
            if options:
                best[(stage + 1, end)] = min(options, key=lambda option: (round(option[0], 9), option[1]))
    bounds, end = [num_layers], num_layers
    for stage in range(stages, 0, -1):
        end = best[(stage, end)][1]
        bounds.append(end)
    bounds.reverse()
    return [range(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]


def rank_stages(pp_rank: int, pp: int, virtual: int) -> list[int]:
    """The stage numbers rank `pp_rank` holds: one per virtual stage, `pp` apart (the loop order of the
    interleaved schedule)."""
    return [pp_rank + index * pp for index in range(virtual)]


def build_schedule(
    modules: Sequence[nn.Module],
    stage_numbers: Sequence[int],
    num_stages: int,
    group: ProcessGroup,
    device: torch.device,
    microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> PipelineScheduleSingle | PipelineScheduleMulti:
    """The 1F1B schedule (one stage per rank) or interleaved 1F1B (several) over `modules`, the stage
    modules this rank holds. `step(arg_mbs=[(input_ids,)...], kwarg_mbs=[{"position_ids": ...}...],
    target_mbs=[labels...])` runs forward and backward of every micro-batch (kwargs reach every
    stage); `loss_fn(logits, labels)` must already be normalised."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

    stages = [
        PipelineStage(module, number, num_stages, device, group=group)
        for module, number in zip(modules, stage_numbers, strict=True)
    ]
    if len(stages) == 1:
        return Schedule1F1B(stages[0], microbatches, loss_fn=loss_fn, scale_grads=False)
    return ScheduleInterleaved1F1B(stages, microbatches, loss_fn=loss_fn, scale_grads=False)
