"""The state of a run set up (`Run`): what its loop, its reference pass and its checkpoints read, apart
from `run.setup`, which builds it."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch
from lightning_fabric import Fabric
from nxd_align import Objective
from nxd_ckpt import Checkpointer, CheckpointUploader
from nxd_data import PretrainingSampler, WithPadding, truncate
from nxd_models import Ceiling
from nxd_parallel import DirectExecutor, ParallelDims, ParallelMesh, PipelineExecutor, StagedModel, split_sequence
from nxd_precision import LossScaler, PrecisionOptimizer, PrecisionPolicy
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader, Dataset

from nxd_train.logging.log_dir import LogDirLock
from nxd_train.logging.monitor import Monitor
from nxd_train.run.plan import RunPlan
from nxd_train.run.profiling import StepProfiler
from nxd_train.run.statistics import StepStatistics
from nxd_train.run.trainer_outputs import TrainerOutputs
from nxd_train.run.training_state import TrainingState

Batch = dict[str, torch.Tensor]


class RolloutPass(Protocol):
    """What the loop asks of an online-RL run's step pass (run.rollouts.Rollouts)."""

    metrics: dict[str, float]
    """What the step's rollouts sampled, as logged."""

    def __call__(self, batches: list[Batch]) -> None: ...

    def write_samples(self, path: Path, step: int) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def resume(self, state: dict[str, Any] | None, drawn: int) -> None: ...


def forward_autocast(fabric: Fabric, policy: PrecisionPolicy) -> Callable[[], AbstractContextManager]:
    """The autocast forward passes run under: Fabric's (bf16, or none), or torch's fp16 one for fp16_autocast,
    which Fabric would swap for bf16 on a CPU."""
    if policy.autocast and policy.compute_dtype == torch.float16:
        return partial(torch.autocast, fabric.device.type, dtype=torch.float16)
    return fabric.autocast


@dataclass
class Run:
    plan: RunPlan
    fabric: Fabric
    dims: ParallelDims
    mesh: ParallelMesh
    log_dir: Path
    monitor: Monitor
    model: nn.Module | StagedModel
    executor: DirectExecutor | PipelineExecutor
    optimizer: PrecisionOptimizer
    scheduler: LRScheduler
    training: TrainingState
    sampler: PretrainingSampler
    """The training sampler, at the position the run starts from."""
    checkpointer: Checkpointer
    checkpoint_record: dict[str, Any]
    """What every checkpoint's marker records of the run (layout, versions, config, Hugging Face mapping)."""
    steps: int
    start_step: int = 0
    saved_rng: bytes | None = None
    """This rank's RNG states from the checkpoint resumed (restored once the data loader has started)."""
    flops_per_token: int = 0
    ceiling: Ceiling | None = None
    """The peak FLOP/s of this run's devices together (MFU's denominator)."""
    mfu_unknown_said: bool = False
    """Whether the log has said why a step's MFU is left out (its rate beat the ceiling)."""
    objective: Objective | None = None
    """The plan's objective, told how this run splits sequences (context parallel); set by `setup`."""
    train_data: Dataset | None = None
    validation_data: Dataset | None = None
    test_data: Dataset | None = None
    """The datasets trained and validated on: the plan's, with DPO's reference log-probs when precomputed."""
    padding: Batch | None = None
    """The sample that fills short batches (adds nothing to the loss)."""
    trainer_outputs: TrainerOutputs | None = None
    """Rank 0's Trainer-style folders (exp_manager.trainer_checkpoints)."""
    resumed_metrics: dict[str, float] = field(default_factory=dict)
    """The values the resumed checkpoint recorded (early stopping's count among them)."""
    profiler: StepProfiler | None = None
    """The profiler window's recorder (exp_manager.profiler); None costs a run nothing."""
    statistics: StepStatistics | None = None
    """The gradient and optimizer-state statistics a step logs (exp_manager.log_gradient_zeros ...)."""
    step_passes: list[Callable[[list[Batch]], None]] = field(default_factory=list)
    """What runs on a step's micro-batches before the objective, in order: the live reference (adds
    `reference_log_probs`), KTO's KL baseline (adds `kto_kl`, keeps the example rows)."""
    attach: list[Callable[[Path], None]] = field(default_factory=list)
    """What rank 0 writes into each checkpoint folder beside the shards (peft adapter files, DPO's table)."""
    checkpoint_group: torch.distributed.ProcessGroup | None = None
    scaler: LossScaler | None = None
    """fp16's loss scale (None for the other precision types)."""
    log_dir_lock: LogDirLock = field(default_factory=lambda: LogDirLock(None))
    """Rank 0's hold on `log_dir` (the others hold nothing)."""
    uploads: CheckpointUploader | None = None
    """Rank 0's uploads of complete checkpoints to S3 (exp_manager.s3_checkpoints)."""
    rollouts: RolloutPass | None = None
    """An online-RL run's step pass: what it sampled (metrics, completions) and its sampling stream."""

    @property
    def repeats(self) -> int:
        return self.plan.repeats

    def drawn(self, steps: int) -> int:
        """Global batches of samples `steps` steps draw."""
        return -(-steps // self.repeats)

    @property
    def token_mesh(self) -> DeviceMesh | None:
        """Ranks that split the tokens of a step (data x context)."""
        return self.mesh.get("dp_cp")

    @property
    def pp_mesh(self) -> DeviceMesh | None:
        return self.mesh.get("pp")

    @property
    def accumulation(self) -> int:
        """Micro-batches per rank per step."""
        return self.sampler.accumulation

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps a pass over the training data takes (each global batch serves `repeats` of them)."""
        return self.sampler.steps_per_epoch * self.repeats

    def on_device(self, batch: Batch) -> Batch:
        """A micro-batch on the device; with context parallelism, this rank's part of each sequence."""
        batch = self.fabric.to_device(batch)
        if self.dims.cp > 1:  # per-token entries only (per-row values such as reference log-probs stay whole)
            batch = {
                key: split_sequence(value, self.dims.cp, self.mesh.rank("cp")) if value.dim() > 1 else value
                for key, value in batch.items()
            }
        return batch

    def micro_batches(
        self,
        dataset: Dataset,
        sampler: Iterable[list[int]],
        lengths: Iterable[int] | None = None,
        inspect: Callable[[Batch], None] | None = None,
    ) -> Iterator[Batch]:
        """This rank's micro-batches of `dataset` as `sampler` orders them, on the device; with `lengths`, each cut
        to its length first (the whole sequence, before context parallelism splits it); `inspect` sees each whole
        micro-batch on the host."""
        loader = DataLoader(
            WithPadding(dataset, self.padding),
            batch_sampler=sampler,
            collate_fn=self.plan.data.collate(self.trim_to, self.packable),
            num_workers=self.plan.batches.num_workers,
        )
        batches = iter(loader) if lengths is None else map(truncate, loader, lengths)
        if inspect is not None:
            batches = map(lambda batch: inspect(batch) or batch, batches)
        return map(self.on_device, batches)

    @property
    def trim_to(self) -> int | None:
        """Micro-batches of pairs and of padded SFT records are cut to their longest sequence, in multiples of
        8 and of the ranks that split the sequence; pipeline stages keep one shape, so every column stays."""
        return None if self.dims.pp > 1 else math.lcm(8, self.dims.tp * self.dims.cp * 2)

    @property
    def packable(self) -> bool:
        """Whether a micro-batch's sequences may share one row: not across pipeline stages (one shape)
        or context-parallel ranks (ring attention computes whole blocks, so a wider row costs its width
        squared), nor where the attention kernel takes masks only."""
        return self.dims.pp == 1 and self.dims.cp == 1 and self.plan.family.attends_document_spans

    def train_batches(self) -> Iterator[Batch]:
        """The training micro-batches from the run's start to its last step."""
        curriculum = self.plan.batches.curriculum
        lengths = (
            None
            if curriculum is None
            else (
                curriculum.length(step + 1)
                for step in range(self.start_step, self.steps)
                for _ in range(self.accumulation)
            )
        )
        steps = self.drawn(self.steps - self.start_step)
        loaded = self.micro_batches(self.train_data, replace(self.sampler, steps=steps), lengths)
        return loaded if self.repeats == 1 else _repeated(loaded, self.accumulation, self.repeats)

    def summed(self, tensor: torch.Tensor, *meshes: DeviceMesh | None) -> torch.Tensor:
        """`tensor` summed over the ranks of each 1-D mesh given (data x context, pipeline), in place."""
        for mesh in meshes:
            if mesh is not None:
                torch.distributed.all_reduce(tensor, group=mesh.get_group())
        return tensor


def _repeated(batches: Iterator[Batch], accumulation: int, repeats: int) -> Iterator[Batch]:
    """Each step's `accumulation` micro-batches, handed out for `repeats` steps (the same dicts: the rollout pass
    rewrites them once, and the later steps train on its rows again)."""
    while step := list(itertools.islice(batches, accumulation)):
        for _ in range(repeats):
            yield from step
