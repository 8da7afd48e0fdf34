"""A training or evaluation step over this rank's pipeline stages (torch.distributed.pipelining).

The schedule runs every micro-batch's forward and backward; the loss of a micro-batch is the sum of
its token losses times the step's normaliser (data x context ranks / global token count), the same
arithmetic as the loop without pipelining, so gradients match one process. Losses are summed in
fp64 so the reported loss is exact; only ranks holding the last stage see them.
"""

from __future__ import annotations

import torch
from nxd_data import IGNORE_INDEX
from nxd_parallel import build_schedule, loss_parallel, token_cross_entropy
from torch.distributed.device_mesh import DeviceMesh

from .parallelism import StagedModel

PER_TOKEN_INPUTS = ("position_ids", "document_ids")
"""Batch entries every stage reads (the first stage also reads input_ids; the last, labels)."""


class PipelineRunner:
    def __init__(self, model: StagedModel, pp: DeviceMesh, device: torch.device, microbatches: int):
        self.scale = 1.0
        self.device = device
        self.schedule = build_schedule(model.stages, model.numbers, model.num_stages, pp.get_group(), device,
                                       microbatches, self._loss)  # fmt: skip

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return token_cross_entropy(logits, labels, IGNORE_INDEX).double().sum() * self.scale

    def _run(self, batches: list[dict[str, torch.Tensor]], scale: float, training: bool) -> torch.Tensor:
        self.scale, losses = scale, []
        inputs = dict(arg_mbs=[(batch["input_ids"],) for batch in batches],
                      kwarg_mbs=[{k: v for k, v in batch.items() if k in PER_TOKEN_INPUTS} for batch in batches],
                      target_mbs=[batch["labels"] for batch in batches], losses=losses)  # fmt: skip
        with loss_parallel():
            if training:
                self.schedule.step(**inputs, return_outputs=False)
            else:
                self.schedule.eval(**inputs)
        total = sum((loss.detach() for loss in losses), torch.zeros((), dtype=torch.float64, device=self.device))
        return total / scale

    def step(self, batches: list[dict[str, torch.Tensor]], scale: float) -> torch.Tensor:
        """Forward and backward of every micro-batch (gradients scaled by `scale`); returns this rank's
        sum of token losses (0 without the last stage)."""
        return self._run(batches, scale, training=True)

    def evaluate(self, batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """The summed token losses of `batches`, forward only (0 without the last stage)."""
        return self._run(batches, 1.0, training=False)
