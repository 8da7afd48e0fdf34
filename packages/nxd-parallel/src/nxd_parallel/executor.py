"""How one step's micro-batches run through this rank's model: directly, one after the other, or
through the pipeline schedule over this rank's stages. Either way the model turns each micro-batch
into its per-token cross-entropy (the last stage, given the labels), and a loss function (an
objective) turns that into a loss sum and metric sums; training runs the backward of
`loss * scale`, where `scale` normalises over the whole global batch, so every layout computes the
gradient of one big batch.

Data parallel gradients are reduced once per step (on the last micro-batch); the schedule does the
same for pipeline stages. Sums are kept in fp64 so reported values are exact; only ranks holding the
last pipeline stage see them (sum them over the pipeline group).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from .parallelize import StagedModel
from .pipeline import build_schedule

Batch = dict[str, torch.Tensor]
LossFunction = Callable[[torch.Tensor, Batch], tuple[torch.Tensor, dict[str, torch.Tensor]]]
"""(per-token losses, micro-batch) -> (its loss sum, its metric sums): what an objective contributes."""
Forward = Callable[[nn.Module, Batch], torch.Tensor]
"""(model, micro-batch) -> per-token losses (batch, seq)."""
MODEL_INPUTS = ("position_ids", "document_ids", "labels")
"""Batch entries every pipeline stage is given besides input_ids (the last one turns its logits into
per-token losses with the labels; the loss function reads the rest)."""


@dataclass
class Totals:
    """Sums over a step's micro-batches on this rank (fp64)."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)

    def add(self, loss: torch.Tensor, metrics: dict[str, torch.Tensor]) -> None:
        self.loss += loss.detach().double()
        for name, value in metrics.items():
            value = value.detach().double()
            self.metrics[name] = self.metrics[name] + value if name in self.metrics else value


class DirectExecutor:
    """Micro-batches one after the other through a whole (or tensor/data/context-parallel) model."""

    def __init__(
        self,
        model: nn.Module,
        forward: Forward,
        device: torch.device,
        autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    ):
        self.model, self.forward, self.device, self.autocast = model, forward, device, autocast

    def run(
        self, batches: list[Batch], loss_fn: LossFunction, *, scale: torch.Tensor | float = 1.0, training: bool = True
    ) -> Totals:
        """Forward (and with `training`, backward of loss * scale) of every micro-batch."""
        from torch.distributed.tensor.parallel import loss_parallel  # loaded by the first step, not by a config check

        from .data_parallel import set_gradient_sync

        totals = Totals(torch.zeros((), dtype=torch.float64, device=self.device))
        for number, batch in enumerate(batches, start=1):
            if training:
                set_gradient_sync(self.model, number == len(batches))  # reduce once, after the last
            with loss_parallel():
                with self.autocast():
                    loss, metrics = loss_fn(self.forward(self.model, batch), batch)
                if training:
                    (loss * scale).backward()
            totals.add(loss, metrics)
        return totals


class PipelineExecutor:
    """Micro-batches through the 1F1B (or interleaved) schedule of this rank's pipeline stages.

    The schedule hands the loss function a target per micro-batch; here that is the micro-batch's
    number, so the objective sees the whole micro-batch. The schedule also calls the loss once
    more, on micro-batch 0, to infer shapes before its first step: results are kept per number,
    so that call is overwritten by the real one."""

    def __init__(
        self,
        model: StagedModel,
        pp: DeviceMesh,
        device: torch.device,
        microbatches: int,
        autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    ):
        self.device, self.autocast = device, autocast
        self._loss_fn: LossFunction | None = None
        self._scale: torch.Tensor | float = 1.0
        self._batches: list[Batch] = []
        self._results: dict[int, tuple[torch.Tensor, dict[str, torch.Tensor]]] = {}
        self.schedule = build_schedule(
            model.stages, model.numbers, model.num_stages, pp.get_group(), device, microbatches, self._stage_loss
        )

    def _stage_loss(self, token_losses: torch.Tensor, number: torch.Tensor) -> torch.Tensor:
        loss, metrics = self._loss_fn(token_losses, self._batches[int(number)])
        self._results[int(number)] = (loss, metrics)
        return loss * self._scale

    def run(
        self, batches: list[Batch], loss_fn: LossFunction, *, scale: torch.Tensor | float = 1.0, training: bool = True
    ) -> Totals:
        """Forward (and with `training`, backward of loss * scale) of every micro-batch; the totals
        are zero on ranks without the last stage."""
        self._loss_fn, self._scale, self._batches, self._results = loss_fn, scale, batches, {}
        inputs = dict(
            arg_mbs=[(batch["input_ids"],) for batch in batches],
            kwarg_mbs=[{k: v for k, v in batch.items() if k in MODEL_INPUTS} for batch in batches],
            target_mbs=[torch.tensor(number) for number in range(len(batches))],
        )
        from torch.distributed.tensor.parallel import loss_parallel

        try:
            with loss_parallel(), self.autocast():
                if training:
                    self.schedule.step(**inputs, return_outputs=False)
                else:
                    self.schedule.eval(**inputs)
            totals = Totals(torch.zeros((), dtype=torch.float64, device=self.device))
            for loss, metrics in self._results.values():
                totals.add(loss, metrics)
            return totals
        finally:
            self._loss_fn, self._batches, self._results = None, [], {}


def build_executor(
    model: nn.Module | StagedModel,
    forward: Forward,
    device: torch.device,
    *,
    pp: DeviceMesh | None,
    microbatches: int,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> DirectExecutor | PipelineExecutor:
    """The executor for `model`: the pipeline schedule when it is a rank's stages, otherwise direct."""
    if isinstance(model, StagedModel):
        return PipelineExecutor(model, pp, device, microbatches, autocast)
    return DirectExecutor(model, forward, device, autocast)
