"""Where a run starts, put in place: its initial weights (an nxd checkpoint, a Hugging Face or GPT-NeoX
folder: weight_init_only), or the whole state of the checkpoint it continues (weights, optimizer,
schedule, step, data position, random states). `run.setup` calls `load_initial_weights` while it builds
the model (before the optimizer copies the weights) and `restore` once the run stands."""

from __future__ import annotations

import time
import warnings
from dataclasses import replace
from pathlib import Path

import torch
from nxd_align import LoraFamily
from nxd_ckpt import CheckpointError, read_info
from nxd_parallel import StagedModel
from nxd_precision import apply_options, apply_schedule
from torch import nn

from nxd_train.logging.monitor import Monitor
from nxd_train.run.checkpointing import Resume
from nxd_train.run.plan import RunPlan
from nxd_train.run.reference import prepare_reference
from nxd_train.run.state import Run
from nxd_train.run.training_state import holds_frozen_base, load_adapters, load_weights

Group = torch.distributed.ProcessGroup | None


def load_initial_weights(
    plan: RunPlan, model: nn.Module | StagedModel, resume: Resume, group: Group, monitor: Monitor
) -> None:
    """The initial weights from an nxd checkpoint or a Hugging Face directory (weight_init_only)."""
    started = time.perf_counter()
    lora = plan.lora
    if lora is not None and plan.adapters.from_checkpoint:
        _load_base(plan, lora, model, resume.path, group)
        load_adapters(model, resume.path, lora, group)
    else:
        load_weights(model, resume, plan.family, group, lora)
    monitor.info(f"initial weights from {resume.path}{_took(started, plan)}")


def restore(run: Run, resume: Resume | None) -> None:
    """The run's reference log-probs (from the initial weights), then the state it continues from: a
    checkpoint's whole state, or a GPT-NeoX iteration's position from its weights alone."""
    if run.plan.reference is not None:  # from the initial weights, before a resume loads trained ones
        device = run.fabric.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            prepare_reference(run, resume)  # draws nothing from the run's random streams
    if resume is not None and not resume.weights_only:
        _resume(run, resume)
    elif resume is not None and resume.start_step:
        _continue_at(run, resume.start_step)


def _took(started: float, plan: RunPlan) -> str:
    return f" in {time.perf_counter() - started:.2f} s" if plan.checkpoints.time_loads else ""


def _load_base(plan: RunPlan, lora: LoraFamily, model: nn.Module | StagedModel, checkpoint: Path, group: Group) -> None:
    """The base weights under the adapters of LoRA checkpoint `checkpoint`, when it does not hold them
    unmerged: from the plan's base source; none is needed when the run that saved it started from
    the seeded initialisation (which this run repeats)."""
    if holds_frozen_base(checkpoint):
        return
    if (source := plan.adapters.base_source) is None:
        saved_config = read_info(checkpoint).extra.get("config", {})
        if saved_config.get("exp_manager", {}).get("resume_from_checkpoint") is None:
            return
        raise CheckpointError(
            f"{checkpoint}: holds LoRA adapters without their base model (saved without "
            "save_lora_base); expected the base in exp_manager.resume_from_checkpoint (continuing "
            "a run) or in model.model_config as a Hugging Face directory (load_lora_from_ckpt)"
        )
    load_weights(model, source, plan.family, group, lora)


def _continue_at(run: Run, step: int) -> None:
    """Continue from weights alone at `step` (a GPT-NeoX checkpoint's iteration, as NeoX continues): the
    schedule at that step, the data after step x global batch samples, a fresh optimizer."""
    if step >= run.steps:
        raise CheckpointError(
            f"the checkpoint's iteration is {step}; this run trains {run.steps} steps, so nothing "
            "is left to train (raise trainer.max_steps, or start from its weights alone with "
            "model.weight_init_only)"
        )
    run.start_step = step
    run.sampler = replace(run.sampler, consumed_samples=step * run.plan.batches.global_batch_size)
    if run.plan.checkpoints.resume_optimizer:  # else the schedule starts from its start, as the optimizer does
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # stepping the schedule before any optimizer step
            for _ in range(step):
                run.scheduler.step()
    run.monitor.info(
        f"continuing at step {step} from the weights alone: the optimizer state, the data position "
        "and the random states of the GPT-NeoX checkpoint are not read (a fresh optimizer, samples "
        "from step x global batch on)"
    )


def _resume(run: Run, resume: Resume) -> None:
    """Continue from a checkpoint: weights, optimizer, schedule, step, data position and, at the same
    world size, every rank's RNG states (a LoRA run's base first, when the checkpoint holds adapters only)."""
    started, monitor, rank, group = time.perf_counter(), run.monitor, run.fabric.global_rank, run.checkpoint_group
    if run.plan.lora is not None:
        _load_base(run.plan, run.plan.lora, run.model, resume.path, group)
    progress, sampler_state = {"step": 0, "consumed_samples": 0}, run.sampler.state_dict()
    checkpoints = run.plan.checkpoints
    same_world = resume.world_size == run.fabric.world_size
    rng = {f"rank{rank}": None} if same_world and checkpoints.resume_rng else {}
    run.training.load(
        resume.path,
        progress=progress,
        sampler=sampler_state,
        rng=rng,
        process_group=group,
        optimizer=checkpoints.resume_optimizer,
    )
    if checkpoints.resume_optimizer:  # this config's hyperparameters from the first resumed step
        update = run.plan.update
        apply_options(run.optimizer.optimizer, update.optimizer, update.options)
        apply_schedule(run.scheduler, update.lr)
    try:
        run.sampler = run.sampler.resumed(sampler_state)
    except ValueError as error:
        hint = ""
        if sampler_state["total_samples"] != run.sampler.total_samples and run.sampler.shuffle:
            hint = (
                "; the run's samples are trainer.max_steps x data.global_batch_size, which changed, and "
                "data.dataloader_type: cyclic shuffles them all at once: extend with dataloader_type: single, "
                "or start from this checkpoint's weights (model.weight_init_only: True)"
            )
        raise CheckpointError(f"{resume.path}: {error}{hint}") from None
    run.start_step, run.saved_rng = progress["step"], rng.get(f"rank{rank}")
    run.resumed_metrics = dict(read_info(resume.path).metrics)
    if not checkpoints.resume_optimizer:
        monitor.info("a fresh optimizer and the learning-rate schedule from its start (resume_optimizer: False)")
    if not checkpoints.resume_rng:
        monitor.info("random states as seeded, not the checkpoint's (resume_rng: False)")
    elif run.saved_rng is None:
        monitor.info(
            f"resuming on {run.fabric.world_size} processes from a checkpoint of {resume.world_size}: "
            "random states start fresh (dropout masks differ from an uninterrupted run)"
        )
    monitor.info(
        f"resumed from {resume.path} at step {run.start_step} ({progress['consumed_samples']} samples)"
        f"{_took(started, run.plan)}"
    )
