"""The checked plan of a run: everything the training loop needs, as plain values.

`preflight.plan_run` builds it from the config before any process starts; the loop reads only the
plan, never the config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from nxd_align import LoraFamily, Objective, TokenObjective
from nxd_align.rewards import Reward
from nxd_ckpt import S3Target, SavePolicy
from nxd_config.schema.alignment import GRPOConfig
from nxd_data import SequenceCurriculum
from nxd_models import ModelFamily
from nxd_parallel import LaunchWorld, Layout, ParallelDims
from nxd_precision import LossScaling, PrecisionPolicy, resolve_policy

from nxd_train.cluster.interrupts import Preemption
from nxd_train.cluster.job import Job
from nxd_train.logging.settings import CometSettings, WandbSettings
from nxd_train.run.checkpointing import Resume
from nxd_train.run.data_splits import DataSplits
from nxd_train.run.profiling import ProfilerWindow
from nxd_train.run.reward_models import RewardModelSource
from nxd_train.run.statistics import StatisticsSettings


@dataclass(frozen=True)
class EarlyStopping:
    """Stop when the validation loss has not improved by min_delta for `patience` validations in a row."""

    patience: int
    min_delta: float = 0.0


@dataclass(frozen=True)
class Cadence:
    """How long the run lasts and when it logs and validates (`trainer` keys, Lightning's meanings)."""

    max_steps: int = -1
    max_epochs: int = -1
    log_every_n_steps: int = 1
    val_check_interval: int | float = 1.0
    check_val_every_n_epoch: int | None = 1
    num_sanity_val_steps: int = 0
    limit_val_batches: int | float = 1.0
    limit_test_batches: int | float = 1.0
    early_stopping: EarlyStopping | None = None
    exit_interval: int | None = None
    """Stop with a checkpoint after each step that is a multiple of it (GPT-NeoX's exit_interval)."""
    decode: Callable[[list[int]], str] | None = None
    """The tokenizer's decoding, with which validation and test also log the character-level perplexity
    (GPT-NeoX's char_level_ppl)."""

    def log_due(self, done: int, steps: int) -> bool:
        """Whether optimizer step `done` (counted from 1) of a run of `steps` is logged."""
        return done % self.log_every_n_steps == 0 or done == steps

    def total_steps(self, steps_per_epoch: int) -> int:
        """max_steps and max_epochs, whichever ends first (-1 means unbounded)."""
        bounds = [self.max_steps] if self.max_steps > 0 else []
        if self.max_epochs > 0:
            bounds.append(self.max_epochs * steps_per_epoch)
        return min(bounds)

    def validation_due(self, global_step: int, epoch: int, index: int, steps_per_epoch: int) -> bool:
        """Lightning's cadence: an int val_check_interval counts steps (across epochs when
        check_val_every_n_epoch is null), a float is a fraction of each epoch."""
        interval, every = self.val_check_interval, self.check_val_every_n_epoch
        if isinstance(interval, int) and every is None:
            return (global_step + 1) % interval == 0
        if every is not None and (epoch + 1) % every:
            return False
        steps = interval if isinstance(interval, int) else max(1, int(interval * steps_per_epoch))
        return (index + 1) % steps == 0


def batch_limit(limit: int | float, available: int) -> int:
    """Lightning's limit_*_batches: an int counts batches, a float is a fraction, -1 (sanity) is all."""
    if isinstance(limit, float):
        return int(available * limit)
    return available if limit < 0 else min(limit, available)


@dataclass(frozen=True)
class Launch:
    """Processes, layout and seed."""

    devices: int = 1
    num_nodes: int = 1
    parallel: ParallelDims = ParallelDims(1)
    """The layout's sizes over devices x num_nodes processes (tp, pp, cp, ep; dp what they leave)."""
    seed: int = 1234
    use_cpu_initialization: bool = True
    neuron_environment: dict[str, str] = field(default_factory=dict)
    """AWS Neuron runtime variables, set only when the device is a Neuron core."""
    fp32_matmul_precision: str = "highest"
    """torch.set_float32_matmul_precision on CUDA devices."""
    keep_freed_host_memory: bool = True
    """glibc keeps freed host memory for the next step when the device is the CPU."""
    collective_timeout: int = 1800
    """Seconds a rank waits for a peer before the run stops naming it."""
    world: LaunchWorld | None = None
    """The processes a launcher started (torchrun, Slurm, mpirun, env://), or None when the run starts its own."""
    job: Job | None = None
    """The launcher's job (its id, the same in every round, and which round this is), or None."""

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes


@dataclass(frozen=True)
class Batches:
    """Batch sizes and how samples are read."""

    global_batch_size: int
    micro_batch_size: int
    num_workers: int = 0
    reshuffle_each_epoch: bool = False
    validation_drop_last: bool = True
    pad_to_global_batch: bool = False
    group_by_length: bool = False
    """Shuffled records are grouped by length (data.group_by_length)."""
    curriculum: SequenceCurriculum | None = None
    """The length each training step cuts its samples to (data.curriculum)."""


@dataclass(frozen=True)
class Update:
    """The optimizer, its learning-rate schedule and gradient clipping (`model.optim`)."""

    optimizer: str = "adamw"
    options: dict[str, Any] = field(default_factory=lambda: {"lr": 1e-4})
    decay_norms_and_biases: bool = False
    schedule: str | None = None
    schedule_options: dict[str, Any] = field(default_factory=dict)
    clip: float | None = None
    """gradient_clip_val; None or 0 clips nothing."""
    on_nonfinite: str = "skip"
    """A step with a NaN/inf loss or gradient norm: "skip" it, or "stop" the run (trainer.on_nonfinite)."""
    max_consecutive_nonfinite: int = 10
    loss_scaling: LossScaling | None = None
    """fp16's loss scaling (None for every other precision type)."""

    @property
    def lr(self) -> float:
        return self.options.get("lr") or 0.0


@dataclass(frozen=True)
class Logging:
    """Where and what a run logs (`exp_manager`)."""

    name: str
    """The run's name (`name`)."""
    exp_name: str
    """The experiment folder under exp_dir (`exp_manager.name`, else `name`)."""
    explicit_log_dir: Path | None = None
    """Log here; otherwise in a new version_N under `exp_dir`/`exp_name`."""
    exp_dir: Path | None = None
    gradient_norm: bool = True
    parameter_norm: bool = False
    step_timing: bool = True
    local_rank_0_only: bool = False
    tensorboard: bool = True
    wandb: WandbSettings | None = None
    """Log to Weights & Biases too (create_wandb_logger)."""
    comet: CometSettings | None = None
    """Log to Comet too (create_comet_logger)."""
    json_log_file: str | None = None
    """Also write each logged step as a JSON line to this file in the log directory."""
    trainer_checkpoints: bool = False
    """Each checkpoint also as transformers' Trainer lays it out, in the log directory."""
    profiler: ProfilerWindow | None = None
    """The steps profiled, and what is recorded of them (exp_manager.profiler)."""
    statistics: StatisticsSettings = StatisticsSettings()
    """Gradient and optimizer-state statistics logged (exp_manager.log_gradient_zeros, ...)."""


@dataclass(frozen=True)
class Checkpoints:
    """When checkpoints are written and what they hold (`exp_manager` checkpoint keys)."""

    enabled: bool = False
    policy: SavePolicy = field(default_factory=lambda: SavePolicy(filename="{step}"))
    asynchronous: bool = False
    use_master_weights: bool = False
    save_bf16: bool = False
    time_loads: bool = False
    """Log how long a load took (enable_recovery_time_instrumentation)."""
    resume_optimizer: bool = True
    """A resume restores the optimizer state and the schedule's position (else a fresh optimizer, the
    schedule from its start)."""
    resume_rng: bool = True
    """A resume restores the random states (at the same number of processes)."""
    s3: S3Target | None = None
    """Where each complete checkpoint is uploaded (exp_manager.s3_checkpoints), or None."""


@dataclass(frozen=True)
class Adapters:
    """LoRA (`model_alignment_strategy.peft`): what its checkpoints hold and where adapters start from."""

    base: str | None = None
    """The base model in checkpoints: "frozen" (save_lora_base), "merged" (merge_lora) or None (adapters only)."""
    config_file: bool = True
    """Write peft's adapter_config.json into each checkpoint (save_lora_config_adapter)."""
    single_file: bool = False
    """Write the whole adapter, gathered from every shard, as adapter_model.safetensors (merge_sharded_lora)."""
    from_checkpoint: bool = False
    """resume_from_checkpoint names a LoRA checkpoint whose adapters start this run (load_lora_from_ckpt)."""
    base_source: Resume | None = None
    """Where the base weights come from when a checkpoint loaded holds adapters only: the initial weights
    of a run that continues, or the Hugging Face model directory with load_lora_from_ckpt."""
    verbose: bool = False


@dataclass(frozen=True)
class Reference:
    """DPO's and KTO's reference model: the run's initial weights (under LoRA, the base with adapters off)."""

    precompute: bool = True
    """Log-probs computed once before the first step into a table kept with the run and its checkpoints
    (precompute_ref_log_probs); False runs the reference beside the policy every step."""
    initial: Resume | None = None
    """Where the initial weights come from (weight_init_only); None: the seeded initialisation."""
    digest: str = ""
    """What decides the table (model, initial weights, precision, data): a table stored under another
    digest belongs to another run."""
    kl_baseline: bool = False
    """KTO: each sample's second row is its mismatched KL sequence, measured each step for the baseline."""


@dataclass(frozen=True)
class OnlineRL:
    """What a GRPO run samples and scores each step (model_alignment_strategy.grpo)."""

    grpo: GRPOConfig
    rewards: tuple[Reward, ...]
    """In the config's order; a reward model's has no function until set-up loads it (`reward_models`)."""
    initial: Resume | None = None
    """The reference's weights when beta > 0 (the run's initial weights); None: the seeded initialisation."""
    reward_models: dict[str, RewardModelSource] = field(default_factory=dict)
    """Each reward model's source, by its reward's name."""


@dataclass(frozen=True)
class RunPlan:
    family: ModelFamily | LoraFamily
    data: DataSplits
    seq_length: int
    logging: Logging
    batches: Batches
    cadence: Cadence = Cadence()
    launch: Launch = Launch()
    preemption: Preemption = Preemption()
    update: Update = Update()
    checkpoints: Checkpoints = Checkpoints()
    layout: Layout = Layout()
    """How the model is split and recomputed."""
    policy: PrecisionPolicy = field(default_factory=lambda: resolve_policy("fp32"))
    """The dtypes of parameters, compute, master weights, gradients and optimizer state."""
    objective: Objective = TokenObjective()
    adapters: Adapters | None = None
    """LoRA settings when the family is a LoraFamily."""
    reference: Reference | None = None
    """DPO's reference log-probs, when the objective needs them."""
    online: OnlineRL | None = None
    """The rollouts of an online-RL run (GRPO)."""
    resume: Resume | None = None
    """The checkpoint (or weights) the run starts from."""
    log_dir: Path | None = None
    """An existing log directory the run continues in (resume_if_exists); None makes a new one."""
    resolved_config: dict[str, Any] = field(default_factory=dict)
    """The resolved config, written beside the logs and into every checkpoint."""
    identity: dict[str, Any] = field(default_factory=dict)
    """What a resume must keep, recorded in every checkpoint: architecture, tokenizer, data."""

    @property
    def repeats(self) -> int:
        """Steps each global batch of samples serves: online RL's num_iterations, else 1."""
        return 1 if self.online is None else self.online.grpo.num_iterations

    @property
    def lora(self) -> LoraFamily | None:
        """The family, when it carries LoRA adapters."""
        return self.family if isinstance(self.family, LoraFamily) else None

    @property
    def precision(self) -> str:
        """Fabric's precision plugin: its autocast for the bf16 autocast type; nxd holds every other dtype itself
        (fp16_autocast's autocast is torch's own: `run_state.forward_autocast`)."""
        return "bf16-mixed" if self.policy.autocast and self.policy.compute_dtype == torch.bfloat16 else "32-true"


class PreflightError(Exception):
    """Problems found before launch, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("cannot train this config:\n" + "\n".join(f"  {problem}" for problem in problems))
