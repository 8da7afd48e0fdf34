"""`exp_manager`: log directory, loggers, checkpoint cadence and retention, resume."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from ._base import Section, Status, frozen_list, key

CKPT = "nxd-ckpt"
APP = "nxd-train"

_HMS = re.compile(r"^(?:(\d+):)?(\d{1,2}):(\d{2}):(\d{2})$")


def _interval_seconds(value: float | str) -> float | str:
    if isinstance(value, str) and not _HMS.match(value):
        raise ValueError(f"expected seconds or 'HH:MM:SS' (optionally 'D:HH:MM:SS'), found {value!r}")
    return value


def interval_seconds(value: float | str | None) -> float | None:
    """A validated train_time_interval in seconds (None stays None)."""
    if value is None or not isinstance(value, str):
        return value
    days, hours, minutes, seconds = (int(part or 0) for part in _HMS.match(value).groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


PROGRESS_VALUES = ("step", "consumed_samples", "epoch")
"""Logged values that count progress: the largest is the newest checkpoint."""


class CheckpointCallbackParams(Section):
    monitor: str = key(
        "step", "Logged value that ranks checkpoints for save_top_k (step, loss, val_loss ...).", by=CKPT
    )
    save_top_k: int = key(
        1, "Checkpoints kept: the best k by monitor/mode; -1 keeps all, 0 keeps none.", by=CKPT, ge=-1
    )
    mode: Literal["min", "max"] | None = key(
        None,
        "Whether a smaller or larger monitor value is better; null: max for step, consumed_samples and epoch "
        "(the newest is best), min for the others (losses, norms).",
        by=CKPT,
    )

    @property
    def ranking(self) -> str:
        """`mode`, or the one its monitor implies: larger is better for a count of progress, smaller otherwise."""
        return self.mode or ("max" if self.monitor in PROGRESS_VALUES else "min")

    save_last: bool = key(
        False,
        "Also keep the most recent checkpoint (linked as 'last'); every run that keeps checkpoints saves "
        "its last step.",
        by=CKPT,
    )
    filename: str | None = key(
        None,
        "Checkpoint name template; {step}, {consumed_samples} and other logged values are filled in. "
        "Null uses '<name>--{step}-{consumed_samples}'.",
        by=CKPT,
    )
    every_n_train_steps: int | None = key(
        None,
        "Save every N optimizer steps; with neither this nor train_time_interval set, a checkpoint is saved "
        "at the end of each epoch and of training.",
        by=CKPT,
        ge=0,
    )
    save_at_steps: frozen_list(Annotated[int, Field(ge=1)]) | None = key(
        None,
        "Also save at the end of these optimizer steps (counted from 1), whatever the other intervals say.",
        by=CKPT,
        status=Status.EXTENSION,
        note="from GPT-NeoX's extra_save_iters and log-scaled checkpoint_factor",
    )
    train_time_interval: Annotated[Annotated[float, Field(gt=0)] | str | None, AfterValidator(_interval_seconds)] = key(
        None, "Save when this much training time has passed (seconds or 'HH:MM:SS').", by=CKPT
    )
    model_parallel_size: int | None = key(
        None,
        "tensor * pipeline parallel size, as NxDT recipes interpolate it; checked against distributed_strategy.",
        by=CKPT,
        ge=1,
    )
    enable_version_counter: bool = key(
        True, "Append -v1, -v2 ... instead of overwriting a checkpoint of the same name.", by=CKPT
    )
    use_master_weights_in_ckpt: bool = key(
        False, "Save the fp32 master weights (when precision keeps them) instead of the model copy.", by=CKPT
    )


NXD_LOG_FILES = ("metrics.csv", "config.yaml", ".nxd-run.lock")


def _log_file_name(value: str | None) -> str | None:
    if value is not None and (
        value in ("", ".", "..")
        or "/" in value
        or "\\" in value
        or value in NXD_LOG_FILES
        or value.startswith("nxd_log_")
    ):
        raise ValueError(f"expected a file name in the log directory other than nxd's own files, found {value!r}")
    return value


class EarlyStoppingParams(Section):
    """NeMo's early_stopping_callback_params (Lightning's EarlyStopping), judged at each validation."""

    monitor: Literal["val_loss"] = key(
        "val_loss",
        "The value judged (the validation loss).",
        by=APP,
        status=Status.EXTENSION,
        note="NeMo's exp_manager",
    )
    mode: Literal["min"] = key(
        "min", "A smaller value is better.", by=APP, status=Status.EXTENSION, note="NeMo's exp_manager"
    )
    min_delta: float = key(
        0.0,
        "An improvement is a value at least this much below the best so far.",
        by=APP,
        ge=0.0,
        status=Status.EXTENSION,
        note="NeMo's exp_manager",
    )
    patience: int = key(
        3,
        "Stop after this many validations in a row without an improvement.",
        by=APP,
        ge=1,
        status=Status.EXTENSION,
        note="NeMo's exp_manager",
    )


class WandbLoggerKwargs(Section):
    project: str | None = key(None, "The W&B project (null: W&B's default).", by=APP)
    name: str | None = key(None, "The run's name (null: the experiment name).", by=APP)
    group: str | None = key(None, "Runs grouped together (with init_all_ranks, every rank's run of this job).", by=APP)
    entity: str | None = key(None, "The W&B team or user the run belongs to.", by=APP)
    host: Annotated[str | None, AfterValidator(no_credentials)] = key(
        None, "The W&B server (null: W&B's default, or WANDB_BASE_URL).", by=APP
    )
    init_all_ranks: bool = key(
        False, "Every rank logs its own run (grouped); false: rank 0 only, with the global values.", by=APP
    )


class CometLoggerKwargs(Section):
    workspace: str | None = key(None, "The Comet workspace (null: the user's default workspace).", by=APP)
    project: str | None = key(None, "The Comet project (null: Uncategorized).", by=APP)
    name: str | None = key(None, "The experiment's name (null: the experiment name of the run).", by=APP)
    tags: frozen_list(str) = key((), "Tags attached to the experiment.", by=APP)
    others: dict[str, Any] | None = key(None, "Other values recorded with the experiment (Comet's log_others).", by=APP)


_CREDENTIALS = (
    "a URL holding '@', as credentials written into it do (not repeated here: a URL is written to "
    "config.yaml, the checkpoints' records and the logs)"
)


def _s3_url(value: str | None) -> str | None:
    if value is None:
        return value
    if "@" in value:  # before anything repeats the value: a secret may hold '/' or ':' anywhere
        raise ValueError(
            f"expected s3://bucket[/prefix], found {_CREDENTIALS}; boto3 reads credentials from "
            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, ~/.aws/credentials or the machine's role"
        )
    bucket = value.removeprefix("s3://").partition("/")[0]
    if not re.fullmatch(r"s3://[^/\s]+(/\S*)?", value):
        raise ValueError(f"expected s3://bucket or s3://bucket/prefix, found {value!r}")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]", bucket) or ".." in bucket:
        raise ValueError(
            f"expected an S3 bucket name (3 to 255 letters, digits, '.', '-' or '_', starting and ending "
            f"with a letter or digit), found {bucket!r}"
        )
    return value


def no_credentials(value: str | None) -> str | None:
    """A URL without credentials in it (a W&B host, a compiler cache): the user's tools read them from their own
    places (WANDB_API_KEY or `wandb login`; AWS_* variables or ~/.aws)."""
    if value is not None and "@" in value:
        raise ValueError(
            f"expected a URL such as https://api.wandb.ai or s3://bucket/prefix, found {_CREDENTIALS}; "
            "wandb reads its API key from WANDB_API_KEY or `wandb login`, boto3 its credentials from "
            "AWS_* variables or ~/.aws"
        )
    return value


class S3Checkpoints(Section):
    """Each complete checkpoint copied to S3 in the background (boto3: nxd-train[s3])."""

    path: Annotated[str | None, AfterValidator(_s3_url)] = key(
        None,
        "s3://bucket[/prefix]: each complete checkpoint goes to <path>/<log dir name>/<checkpoint folder>/, "
        "file by file, as multipart uploads whose digests are checked; a failed file is tried again, then the "
        "checkpoint is reported and training goes on. boto3 finds credentials and the endpoint as usual (AWS_* "
        "variables, ~/.aws; AWS_ENDPOINT_URL for an S3-compatible server). null: no uploads.",
        by=CKPT,
    )
    chunk_size: int = key(
        104_857_600, "Bytes per uploaded part (S3 takes 5 MiB to 5 GiB).", by=CKPT, ge=5 * 2**20, le=5 * 2**30
    )


class ProfilerParams(Section):
    """torch.profiler over a window of optimizer steps, and memory records of the same steps."""

    enabled: bool = key(
        False,
        "Trace optimizer steps start_step..stop_step with torch.profiler (host and accelerator activity, "
        "shapes, memory, FLOPs, Python stacks): one Chrome trace per rank, <log dir>/profiler/rank<N>.<ms>.pt.trace"
        ".json, which TensorBoard's profiler plugin and Perfetto open; each step is a ProfilerStep#<step> range. "
        "On CUDA the window is also nsys's capture range (cudaProfilerStart / Stop).",
        by=APP,
        status=Status.EXTENSION,
        note="from GPT-NeoX's profile",
    )
    start_step: int = key(
        11,
        "The first optimizer step profiled (counted from 1).",
        by=APP,
        ge=1,
        status=Status.EXTENSION,
        note="GPT-NeoX's profile_step_start + 1",
    )
    stop_step: int = key(
        13,
        "The last optimizer step profiled (at least start_step).",
        by=APP,
        ge=1,
        status=Status.EXTENSION,
        note="GPT-NeoX's profile_step_stop + 1",
    )
    memory: bool = key(
        False,
        "Record memory over the same steps, per rank: on CUDA a memory snapshot with allocation stacks "
        "(torch.cuda.memory; rank<N>.<ms>.memory_snapshot.pickle, opened at pytorch.org/memory_viz); on other "
        "devices the profiler's memory timeline (rank<N>.<ms>.memory_timeline.html).",
        by=APP,
        status=Status.EXTENSION,
        note="from GPT-NeoX's memory_profiling",
    )
    memory_dir: str | None = key(
        None,
        "Where the memory records go; null: <log dir>/profiler.",
        by=APP,
        status=Status.EXTENSION,
        note="from GPT-NeoX's memory_profiling_path",
    )

    @model_validator(mode="after")
    def _window(self) -> ProfilerParams:
        if self.stop_step < self.start_step:
            raise ValueError(
                f"stop_step ({self.stop_step}) is before start_step ({self.start_step}): the profiled "
                "steps are start_step..stop_step"
            )
        return self


class GradientNoiseScaleParams(Section):
    """McCandlish et al.'s gradient noise scale, estimated as GPT-NeoX estimates it."""

    enabled: bool = key(
        False,
        "Log train/noise_scale, the simple noise scale B = tr(S) / |G|^2: one step's global batch against "
        "the mean gradient of n_batches steps in a row, each a moving average (beta 0.99). Norms are global, so "
        "every layout gives what one process does; a resumed run starts the estimate anew.",
        by=APP,
        status=Status.EXTENSION,
        note="from GPT-NeoX's log_gradient_noise_scale (which NeoX refuses under ZeRO)",
    )
    n_batches: int = key(
        5,
        "Steps whose mean gradient is the big batch.",
        by=APP,
        ge=2,
        status=Status.EXTENSION,
        note="GPT-NeoX's gradient_noise_scale_n_batches",
    )
    cpu_offload: bool = key(
        False,
        "Keep the running sum of gradients (one copy of this rank's gradient shards) in host memory.",
        by=APP,
        status=Status.EXTENSION,
        note="GPT-NeoX's gradient_noise_scale_cpu_offload",
    )


class ExpManagerConfig(Section):
    log_local_rank_0_only: bool = key(False, "Only local rank 0 of each node writes logs.", by=APP)
    create_tensorboard_logger: bool = key(False, "Write loss and metrics as TensorBoard events.", by=APP)
    explicit_log_dir: str | None = key(
        None,
        "Log and checkpoint directory, used as is. Older spelling: exp_log_dir.",
        by=APP,
    )
    exp_dir: str | None = key(
        None, "Base directory; logs go to <exp_dir>/<name> when explicit_log_dir is null.", by=APP
    )
    name: str | None = key(None, "Experiment name used for the log directory; null uses the top-level name.", by=APP)
    log_step_timing: bool = key(True, "Log the wall time of each training step.", by=APP)
    resume_if_exists: bool = key(False, "Resume from the newest complete checkpoint in the log directory.", by=CKPT)
    resume_ignore_no_checkpoint: bool = key(
        False,
        "With resume_if_exists, start fresh (with a notice) when no checkpoint exists instead of failing.",
        by=CKPT,
    )
    resume_from_checkpoint: str | None = key(
        None,
        "Resume from this checkpoint path explicitly (a run's log directory: its newest complete checkpoint).",
        by=CKPT,
    )
    resume_from_checkpoint_optional: bool = key(
        False,
        "A missing or empty resume_from_checkpoint starts a new run (with a notice) instead of failing.",
        by=CKPT,
        status=Status.EXTENSION,
        note="from GPT-NeoX's load, which starts fresh from nothing",
    )
    resume_optimizer: bool = key(
        True,
        "A resume restores the optimizer state and the LR schedule's position; false: the weights, step, data "
        "position and random states only, with a fresh optimizer and the schedule from its start.",
        by=APP,
        status=Status.EXTENSION,
        note="from GPT-NeoX's no_load_optim",
    )
    resume_rng: bool = key(
        True,
        "A resume restores every rank's random states; false: the run's seeded ones.",
        by=APP,
        status=Status.EXTENSION,
        note="from GPT-NeoX's no_load_rng",
    )
    resume_schedule: Literal["config", "checkpoint", "same"] = key(
        "config",
        "On resume the learning rate and schedule (model.optim.lr, model.optim.sched) come from this config; "
        "checkpoint: from the config the checkpoint recorded; same: from this config, refused when they differ.",
        by=APP,
        status=Status.EXTENSION,
        note="from GPT-NeoX's override_lr_scheduler, use_checkpoint_lr_scheduler and its default check",
    )
    create_wandb_logger: bool = key(
        False,
        "Log the run's values to Weights & Biases (the wandb package: nxd-train[wandb]); WANDB_MODE=offline writes "
        "the run under the log directory's wandb folder.",
        by=APP,
        status=Status.EXTENSION,
        note="NeMo's exp_manager key; from GPT-NeoX's use_wandb",
    )
    wandb_logger_kwargs: WandbLoggerKwargs = key(
        WandbLoggerKwargs(),
        "Where the W&B run goes.",
        by=APP,
        status=Status.EXTENSION,
        note="from GPT-NeoX's wandb_project, wandb_group, wandb_team, wandb_host, wandb_run_name, wandb_init_all_ranks",
    )
    create_comet_logger: bool = key(
        False,
        "Log the run's values to Comet (the comet-ml package: nxd-train[comet]), the same values TensorBoard gets. "
        "With an API key (COMET_API_KEY or `comet login`) online; without one, an offline experiment under the log "
        "directory's comet folder, for `comet upload`. A resumed run goes on in the same experiment.",
        by=APP,
        status=Status.EXTENSION,
        note="from GPT-NeoX's use_comet",
    )
    comet_logger_kwargs: CometLoggerKwargs = key(
        CometLoggerKwargs(),
        "Where the Comet experiment goes.",
        by=APP,
        status=Status.EXTENSION,
        note="from GPT-NeoX's comet_workspace, comet_project, comet_experiment_name, comet_tags, comet_others",
    )
    create_checkpoint_callback: bool = key(True, "Save checkpoints as checkpoint_callback_params says.", by=CKPT)
    s3_checkpoints: S3Checkpoints = key(
        S3Checkpoints(),
        "Where complete checkpoints are uploaded.",
        by=CKPT,
        status=Status.EXTENSION,
        note="from GPT-NeoX's s3_path and s3_chunk_size",
    )
    checkpoint_callback_params: CheckpointCallbackParams = key(
        CheckpointCallbackParams(), "When checkpoints are written and how many are kept.", by=CKPT
    )
    create_early_stopping_callback: bool = key(
        False,
        "Stop training when the validation loss stops improving (early_stopping_callback_params); the run "
        "ends with a checkpoint of the step it stopped at.",
        by=APP,
        status=Status.EXTENSION,
        note="NeMo's exp_manager",
    )
    early_stopping_callback_params: EarlyStoppingParams = key(
        EarlyStoppingParams(), "When training stops early.", by=APP, status=Status.EXTENSION, note="NeMo's exp_manager"
    )
    json_log_file: Annotated[str | None, AfterValidator(_log_file_name)] = key(
        None,
        "Also write every logged value as one JSON object per line (with its step) to this file in the log "
        "directory (a file name, not one of nxd's own files).",
        by=APP,
        status=Status.EXTENSION,
        note="transformers' JSON logging callbacks",
    )
    trainer_checkpoints: bool = key(
        False,
        "Also write each checkpoint as transformers' Trainer lays it out, in the log directory: "
        "checkpoint-<step>/ with the peft adapter (LoRA) or the model, the tokenizer and trainer_state.json (a "
        "resume may name it), and the final adapter or model in the log directory itself.",
        by=CKPT,
        status=Status.EXTENSION,
        note="transformers' Trainer output_dir",
    )
    require_empty_log_dir: bool = key(
        False,
        "True: refuse to start a new run in an explicit log directory that holds any file (a resume may). "
        "Unset: refuse only an earlier run's records there (config.yaml, metrics.csv, checkpoints, the W&B run or "
        "Comet experiment), naming the keys that changed, unless the run resumes. False, written: start there and "
        "write over those records.",
        by=APP,
        status=Status.EXTENSION,
        note="transformers' overwrite_output_dir: false",
    )
    profiler: ProfilerParams = key(
        ProfilerParams(),
        "torch.profiler traces and memory records of a window of steps.",
        by=APP,
        status=Status.EXTENSION,
        note="from GPT-NeoX's profile and memory_profiling",
    )
    log_gradient_zeros: bool = key(
        False,
        "Log pct_grad_zeros/<parameter>: the percent of each parameter's gradient that is exactly 0, over the "
        "whole parameter whatever the layout, before clipping.",
        by=APP,
        status=Status.EXTENSION,
        note="from GPT-NeoX's log_grad_pct_zeros",
    )
    log_optimizer_states: bool = key(
        False,
        "Log optimizer_state_norms/<parameter>_<state>: the L2 norm of each of the optimizer's state tensors "
        "(Adam's exp_avg and exp_avg_sq ...) of each parameter after the step, over the whole parameter.",
        by=APP,
        status=Status.EXTENSION,
        note="from GPT-NeoX's log_optimizer_states (which names parameters by index)",
    )
    gradient_noise_scale: GradientNoiseScaleParams = key(
        GradientNoiseScaleParams(),
        "The gradient noise scale.",
        by=APP,
        status=Status.EXTENSION,
        note="from GPT-NeoX's log_gradient_noise_scale",
    )
    log_parameter_norm: bool = key(False, "Log the global parameter norm across model-parallel ranks.", by=APP)
    log_gradient_norm: bool = key(False, "Log the global gradient norm across model-parallel ranks.", by=APP)
    enable_recovery_time_instrumentation: bool = key(
        False, "Log how long checkpoint loading and recovery take.", by=CKPT
    )
    async_checkpointing: bool = key(
        False,
        "Write checkpoints from a background thread after copying them to host memory; at most one save in "
        "flight, and the next save and process exit wait for it.",
        by=CKPT,
    )
    save_bf16: bool = key(False, "Store floating-point model weights as bf16 in checkpoints.", by=CKPT)
    save_xser: bool = key(
        False,
        "Save with torch-xla serialization.",
        by=CKPT,
        status=Status.NEURON_ONLY,
        note="not applicable off Neuron: nxd writes torch.distributed.checkpoint shards",
    )
    load_xser: bool = key(
        False,
        "Load with torch-xla serialization.",
        by=CKPT,
        status=Status.NEURON_ONLY,
        note="not applicable off Neuron: nxd reads torch.distributed.checkpoint shards",
    )
    ckpt_ptl_version: str = key(
        "2.5.0",
        "PyTorch Lightning version of a checkpoint that does not record it.",
        by=CKPT,
        status=Status.NEURON_ONLY,
        note="only NxDT's Lightning checkpoints need it; nxd checkpoints record their own versions",
    )
