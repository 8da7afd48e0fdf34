"""Where a run continues, put in place once it stands: its reference log-probs (from the initial weights), then the
whole state of the checkpoint it continues (weights, optimizer, schedule, step, data position, random states), or
a GPT-NeoX iteration's position from its weights alone. The weights it starts from are `initial_weights`'."""

from __future__ import annotations

import time
import warnings
from dataclasses import replace

import torch
from nxd_ckpt import CheckpointError, read_info
from nxd_precision import apply_options, apply_schedule

from nxd_train.run.checkpointing import Resume
from nxd_train.run.initial_weights import load_base, load_time
from nxd_train.run.reference import prepare_reference
from nxd_train.run.state import Run


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
        load_base(run.plan, run.plan.lora, run.model, resume.path, group)
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
        f"{load_time(started, run.plan)}"
    )
