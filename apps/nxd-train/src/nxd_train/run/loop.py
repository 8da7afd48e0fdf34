"""The training loop: set the run up, then for each step fetch the micro-batches, run the objective
through the executor, step the optimizer, log, validate and checkpoint.

Loss normalisation: every micro-batch contributes its objective's loss *sum*, divided by the
objective's count (for token objectives, the labels that are not ignored) over the whole global
batch (all micro-batches of all data-parallel ranks, all context-parallel parts). FSDP2 averages
gradients over the data x context ranks, so each rank scales its part by dp * cp. The result is the
gradient of one big batch, whatever the layout and the split into micro-batches.
"""

from __future__ import annotations

import math
import signal
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import torch
from nxd_data import PretrainingSampler
from nxd_models import IGNORE_INDEX, peak_memory, routing_metrics, take_routing_totals
from nxd_parallel import clip_gradients, global_norm, modules_of
from nxd_precision import NonFiniteGuard, NonFiniteStop
from torch.utils.data import Dataset

from nxd_train.cluster import peers
from nxd_train.cluster.interrupts import StopRequests, TrainingInterrupted, requeue
from nxd_train.logging.log_dir import COMPLETIONS_FILE
from nxd_train.run.plan import EarlyStopping, RunPlan, batch_limit
from nxd_train.run.rollout_metrics import ROLLOUT_PREFIXES
from nxd_train.run.setup import setup
from nxd_train.run.state import Batch, Run
from nxd_train.run.statistics import PREFIXES as STATISTICS
from nxd_train.run.training_state import restore_rng_states, rng_states, saved_extra


class UploadsFailed(Exception):
    """Training ended, but checkpoints the run was to copy to S3 are not there: the run exits 1 so that the job
    says so (the checkpoints are in the log directory still, unless retention removed them)."""


def train(plan: RunPlan) -> Path:
    """Run the job `plan` describes; returns the log directory, which the run holds until it ends."""
    try:
        run = setup(plan)
        try:
            return _train(run)
        finally:
            run.log_dir_lock.release()
    except (RuntimeError, torch.distributed.DistError) as error:
        if (watch := peers.current()) is not None and peers.collective_failure(error):
            watch.explain(error)  # names a peer that is gone, and leaves
        raise
    finally:
        if (watch := peers.current()) is not None:  # this rank's silence is no failure from now on
            watch.finish()


def _train(run: Run) -> Path:
    plan = run.plan
    cadence, checkpoints = plan.cadence, plan.checkpoints
    sanity = evaluate(run, run.validation_data, cadence.num_sanity_val_steps) if cadence.num_sanity_val_steps else None
    if sanity is not None:
        run.monitor.info(f"sanity check: val_loss {sanity:.4f}")
    run.model.train()
    batches = run.train_batches()
    if run.saved_rng is not None and not restore_rng_states(run.saved_rng):  # now, as at the save: after the loader
        run.monitor.info(
            "random states as seeded: the checkpoint holds them pickled (an earlier nxd), and a "
            "checkpoint is never unpickled"
        )
    if run.rollouts is not None:  # the rollouts a resumed run had drawn (its next completions' seeds)
        if run.start_step % run.repeats:  # its data position is after that rollout's prompts
            run.monitor.info(
                f"resumed at step {run.start_step}, inside a rollout batch's model_alignment_strategy.grpo."
                f"num_iterations ({run.repeats}) updates, which the checkpoint does not hold: the run goes on with "
                "a new rollout of the next prompts (it trains that many updates fewer on the last one)"
            )
        extra = None if run.saved_rng is None else saved_extra(run.saved_rng)
        run.rollouts.resume(None if extra is None else extra.get("rollouts"), run.drawn(run.start_step))
    window_time, window_steps = 0.0, 0  # training time since the last log line (validation excluded)
    logged: dict[str, float] = {}  # the latest value of everything logged, for checkpoint names and ranking
    guard = NonFiniteGuard(plan.update.on_nonfinite, plan.update.max_consecutive_nonfinite)
    saved_at = None  # the step of the latest save
    stopper = None if cadence.early_stopping is None else ValidationWatch(cadence.early_stopping, run.resumed_metrics)
    done = run.start_step
    run.monitor.begin(run.start_step)
    with StopRequests(plan.preemption.signals, acknowledge=run.fabric.global_rank == 0) as stops:
        for step in range(run.start_step, run.steps):
            started = time.perf_counter()
            epoch, index = divmod(step, run.steps_per_epoch)
            try:
                with run.profiler.step(step + 1) if run.profiler is not None else nullcontext():
                    values = train_step(run, [next(batches) for _ in range(run.accumulation)], guard, step + 1)
            except NonFiniteStop:
                _close(run)
                raise
            if warning := guard.zero_gradient_warning(step + 1, values["grad_norm"]):
                run.monitor.info(warning)
            if step == run.start_step and plan.layout.compile_blocks:
                took = time.perf_counter() - started
                run.monitor.info(
                    f"model.fusions.torch_compile: the first step took {took:.1f} s, compiling the decoder blocks"
                )
            logged.update(
                {name: value for name, value in values.items() if not name.startswith(STATISTICS)}, epoch=epoch
            )  # what checkpoints record: not every parameter's statistics
            window_time, window_steps = window_time + time.perf_counter() - started, window_steps + 1
            run.monitor.advance()
            done = step + 1
            if cadence.log_due(done, run.steps):
                shown = log_values(run, values, epoch, done, window_time / window_steps)
                if run.rollouts is not None and run.fabric.global_rank == 0:
                    run.rollouts.write_samples(run.log_dir / COMPLETIONS_FILE, done)
                skipped = guard.skipped + (0 if run.scaler is None else run.scaler.skipped)
                run.monitor.metrics(done, shown | ({"skipped_steps": skipped} if skipped else {}))
                window_time, window_steps = 0.0, 0
            val_loss = None
            if cadence.validation_due(step, epoch, index, run.steps_per_epoch):
                val_loss, per_char = evaluate_with_characters(run, run.validation_data, cadence.limit_val_batches)
                if val_loss is not None:
                    shown = {"val_loss": val_loss} | character_level(per_char, val_loss, "validation")
                    run.monitor.metrics(done, shown)
                    logged["val_loss"] = val_loss
            stopping = stopper is not None and val_loss is not None and stopper.stalled(val_loss)
            if stopper is not None:
                logged.update(stopper.record())  # a resume continues the count
            exiting = cadence.exit_interval is not None and done % cadence.exit_interval == 0 and done < run.steps
            if checkpoints.enabled and not guard.streak and (checkpoint_due(run, done, index) or stopping or exiting):
                save_checkpoint(run, done, logged)
                saved_at = done
            if exiting:
                _exit_at_interval(run, done, saved=saved_at == done)
                return run.log_dir
            if stopping:
                run.monitor.info(
                    f"early stopping after step {done} of {run.steps}: val_loss has not improved on "
                    f"{stopper.best:.4f} by {stopper.rule.min_delta} for {stopper.rule.patience} "
                    "validations"
                )
                break
            if (signum := stops.agreed(run.fabric.device)) is not None and done < run.steps:
                _stop_on_signal(run, signum, done, logged, saved=saved_at == done, finite=not guard.streak)
    _settle(run)
    if run.trainer_outputs is not None:
        run.trainer_outputs.finish()
    test_loss, per_char = evaluate_with_characters(run, run.test_data, cadence.limit_test_batches)
    if test_loss is not None:
        run.monitor.metrics(done, {"test_loss": test_loss} | character_level(per_char, test_loss, "test"))
    run.monitor.info(f"done: {done} steps; logs in {run.log_dir}")
    _end(run)
    return run.log_dir


class ValidationWatch:
    """Early stopping's count (Lightning's EarlyStopping, mode min): validations in a row whose loss is not
    below the best so far by more than min_delta."""

    BEST, WAITED = "early_stopping_best", "early_stopping_waited"

    def __init__(self, rule: EarlyStopping, resumed: dict[str, float]):
        """`resumed`: the values a resumed checkpoint recorded (`record`), so the count goes on."""
        self.rule = rule
        self.best, self.waited = resumed.get(self.BEST, math.inf), int(resumed.get(self.WAITED, 0))

    def record(self) -> dict[str, float]:
        """What a checkpoint keeps of the count."""
        return {self.BEST: self.best, self.WAITED: self.waited}

    def stalled(self, val_loss: float) -> bool:
        """Count `val_loss`; whether training should stop."""
        if val_loss < self.best - self.rule.min_delta:
            self.best, self.waited = val_loss, 0
        else:
            self.waited += 1
        return self.waited >= self.rule.patience


def _settle(run: Run) -> None:
    """The profiler window ends and the save in flight completes."""
    if run.profiler is not None:
        run.profiler.close()
    run.checkpointer.wait()


def _close(run: Run) -> None:
    """End a run that stops early: `_settle`, uploads still running are named (a stop does not wait for them), the
    logs are flushed."""
    _settle(run)
    finish_uploads(run, wait=False)
    run.monitor.close()


def _end(run: Run) -> None:
    """A run's planned end: every rank meets, then rank 0 waits for its checkpoint uploads (the other ranks leave, so
    a long upload holds no collective open) and names those that failed (UploadsFailed); the logs are flushed."""
    run.fabric.barrier()
    try:
        finish_uploads(run, wait=True)
    finally:
        run.monitor.close()


def _exit_at_interval(run: Run, done: int, *, saved: bool) -> None:
    """trainer.exit_interval (GPT-NeoX's): end the run after step `done` with exit code 0, as NeoX's sys.exit()."""
    where = (
        f"checkpoint saved in {run.checkpointer.root}; a run resuming from it (GPT-NeoX's load, NxDT's "
        "exp_manager.resume_if_exists) continues to the next multiple"
        if saved
        else "nothing was saved (checkpointing is off, or the step was not finite)"
    )
    run.monitor.info(f"trainer.exit_interval: exiting after step {done} of {run.steps}: {where}")
    _settle(run)
    _end(run)


def _stop_on_signal(run: Run, signum: int, done: int, logged: dict[str, float], *, saved: bool, finite: bool) -> None:
    """After step `done`, on a signal: checkpoint (unless this step is saved already, or was not finite)
    and raise TrainingInterrupted saying where to resume."""
    if not run.plan.checkpoints.enabled:
        where = "checkpointing is off, so nothing was saved; a resume starts from the last complete checkpoint"
    elif not finite:
        where = "the step was not finite, so nothing was saved; a resume starts from the last complete checkpoint"
    else:
        if not saved:
            save_checkpoint(run, done, logged)
        run.checkpointer.wait()
        job = run.plan.launch.job
        if run.plan.preemption.requeues(signum, slurm=job is not None and job.launcher == "slurm"):
            where = f"checkpoint saved in {run.checkpointer.root}; "
            if run.fabric.global_rank == 0:
                where += requeue(job.job_id)
        else:
            where = (
                f"checkpoint saved in {run.checkpointer.root}; run the same command with resume_from_checkpoint "
                f"naming {run.log_dir} (its newest checkpoint; NxDT: exp_manager.resume_from_checkpoint, or "
                "exp_manager.resume_if_exists=True) to continue from it"
            )
    stopped = TrainingInterrupted(
        f"stopped by {signal.Signals(signum).name} after step {done} of {run.steps}: {where}",
        run.plan.preemption.code(signum),
    )
    _close(run)
    raise stopped


def train_step(run: Run, batches: list[Batch], guard: NonFiniteGuard, step: int) -> dict[str, float]:
    """Optimizer step `step` over this rank's micro-batches of a global batch: the objective's loss and
    metrics (means over the global count), the learning rate used and the gradient norm. A step whose
    loss or gradient norm is not finite updates nothing (`guard` says whether to skip or stop)."""
    objective = run.objective
    for step_pass in run.step_passes:
        step_pass(batches)
    count = run.summed(sum(objective.count(batch) for batch in batches).double(), run.token_mesh)
    loss_scale = 1.0 if run.scaler is None else run.scaler.scale
    totals = run.executor.run(batches, objective.loss, scale=run.dims.dp * run.dims.cp * loss_scale / count)
    sums = {
        "loss": totals.loss,
        **{name: totals.metrics.get(name, torch.zeros_like(totals.loss)) for name in objective.metric_names},
    }  # none on ranks without the last stage
    values = {name: (run.summed(value, run.token_mesh, run.pp_mesh) / count).item() for name, value in sums.items()}
    values = objective.report(values)
    if run.rollouts is not None:  # what the step's rollouts sampled
        values.update(run.rollouts.metrics)
    run.optimizer.collect_gradients()
    if run.scaler is not None:
        run.scaler.unscale_(run.optimizer.gradient_tensors)
    logged = run.plan.cadence.log_due(step, run.steps)
    statistics = {} if run.statistics is None else run.statistics.gradients(run.optimizer, logged)
    grad_norm = gradient_norm(run)
    moe = routing(run)
    if "moe_aux_loss" in moe:  # the loss trained on: cross-entropy plus the weighted load-balancing loss
        values["loss"] += run.plan.family.moe.router_aux_loss_coef * moe["moe_aux_loss"]
    first = run.optimizer.param_groups[0]  # the schedule's rate (a muP group steps with a multiple of it)
    values.update(lr=first["lr"] / first.get("lr_scale", 1.0), grad_norm=grad_norm, **moe, **statistics)
    if (curriculum := run.plan.batches.curriculum) is not None:
        values["curriculum_seqlen"] = curriculum.length(step)
    cause = ""
    if run.scaler is not None:
        values["loss_scale"] = loss_scale
        overflow = math.isfinite(values["loss"]) and not math.isfinite(grad_norm)
        cause = run.scaler.floor if overflow else ""
        if run.scaler.update(overflow):  # skipped, with a smaller scale (or the hysteresis) for the next step
            run.optimizer.zero_grad(set_to_none=True)
            return values
    if not guard.check(step, values["loss"], grad_norm, cause):  # every rank sees the same global values
        run.optimizer.step()
        run.scheduler.step()
        if run.statistics is not None and logged:
            values.update(run.statistics.optimizer_states(run.optimizer))
    run.optimizer.zero_grad(set_to_none=True)
    return values


def routing(run: Run) -> dict[str, float]:
    """A mixture-of-experts model's routing over the step (see nxd-models' `routing_metrics`), with the
    weighted load-balancing loss that joined the training loss; nothing for a dense model."""
    family = run.plan.family
    if family.moe is None:
        return {}
    totals = take_routing_totals(modules_of(run.model))
    return routing_metrics(
        totals, moe_layer_count=family.moe_layer_count, num_experts=family.moe.num_experts, copies=run.dims.tp
    )


@torch.no_grad()
def evaluate(run: Run, dataset: Dataset | None, limit: int | float) -> float | None:
    """The objective's loss over `dataset` (at most `limit` global batches), or None when there is none."""
    return evaluate_with_characters(run, dataset, limit)[0]


@torch.no_grad()
def evaluate_with_characters(run: Run, dataset: Dataset | None, limit: int | float) -> tuple[float | None, float]:
    """`evaluate`'s loss, and the tokens per character of the samples evaluated when the plan decodes them
    (trainer.char_level_ppl; else 0): each sample's input tokens against the characters they decode to, as GPT-NeoX
    counts them, padding samples left out."""
    if dataset is None:
        return None, 0.0
    sampler = eval_sampler(run, dataset)
    count = batch_limit(limit, sampler.steps_per_epoch)
    if count == 0:
        return None, 0.0
    objective, device = run.objective, run.fabric.device
    run.model.eval()
    loss = torch.zeros((), dtype=torch.float64, device=device)
    total = torch.zeros((), dtype=torch.float64, device=device)
    text = torch.zeros(2, dtype=torch.float64)  # tokens, characters (each context-parallel rank counts the same)
    decode = run.plan.cadence.decode

    def count_characters(batch: Batch) -> None:
        for tokens, labels in zip(batch["input_ids"], batch["labels"], strict=True):
            if (labels != IGNORE_INDEX).any():
                text.add_(torch.tensor([len(tokens), len(decode(tokens.tolist()))], dtype=torch.float64))

    batches = run.micro_batches(
        dataset, replace(sampler, steps=count), inspect=count_characters if decode is not None else None
    )
    for _ in range(count):
        step_batches = [next(batches) for _ in range(run.accumulation)]
        for step_pass in run.step_passes:
            step_pass(step_batches)
        loss += run.executor.run(step_batches, objective.loss, training=False).loss
        total += sum(objective.count(batch) for batch in step_batches)
    run.model.train()
    value = (run.summed(loss, run.token_mesh, run.pp_mesh) / run.summed(total, run.token_mesh)).item()
    if decode is None:
        return value, 0.0
    tokens, characters = run.summed(text.to(device), run.token_mesh).tolist()
    return value, tokens / max(characters, 1.0)


def character_level(tokens_per_char: float, loss: float, split: str) -> dict[str, float]:
    """GPT-NeoX's character-level perplexity, exp(loss x tokens per character), under its name (nothing without
    a count)."""
    return {f"{split}/lm_loss_char_lvl_ppl": math.exp(loss * tokens_per_char)} if tokens_per_char else {}


def gradient_norm(run: Run) -> float:
    """The global gradient norm before clipping (over every tensor- and data-parallel shard and pipeline
    stage, as one process would compute it), the gradients the optimizer steps on clipped to
    gradient_clip_val (null or 0: no clipping)."""
    tensors, clip = run.optimizer.gradient_tensors, run.plan.update.clip
    stages = None if run.pp_mesh is None else run.pp_mesh.get_group()
    if clip:
        return clip_gradients(tensors, clip, stages).item()
    return global_norm((t.grad for t in tensors if t.grad is not None), stages).item()


def log_values(run: Run, values: dict[str, float], epoch: int, done: int, step_time: float) -> dict[str, float]:
    """What a log line records after optimizer step `done`, given the mean time of the recent steps."""
    logging, gbs = run.plan.logging, run.plan.batches.global_batch_size
    data = run.plan.data
    length = int(values.get("curriculum_seqlen", run.plan.seq_length))
    processed = gbs * (data.trained_rows_per_sample or data.rows_per_sample) * length
    shown = {
        "loss": values["loss"],
        **{name: values[name] for name in run.plan.objective.metric_names if name in values},  # report may drop helpers
        "lr": values["lr"],
        "epoch": epoch,
        "consumed_samples": run.drawn(done) * gbs,
    }
    if logging.gradient_norm:
        shown["grad_norm"] = values["grad_norm"]
    shown.update(
        {
            name: value
            for name, value in values.items()
            if name.startswith(("moe_", *STATISTICS, *ROLLOUT_PREFIXES)) or name in ("loss_scale", "curriculum_seqlen")
        }
    )
    if logging.parameter_norm:
        stages = None if run.pp_mesh is None else run.pp_mesh.get_group()
        shown["param_norm"] = global_norm((p.detach() for p in run.model.parameters()), stages).item()
    shown.update(tokens_per_s=processed / step_time, samples_per_s=gbs / step_time)
    if (mfu := run.ceiling.utilisation(run.flops_per_token * processed / step_time)) is not None:
        shown["mfu"] = mfu
    elif not run.mfu_unknown_said:
        run.mfu_unknown_said = True
        run.monitor.info(run.ceiling.beaten())
    shown["peak_memory_gib"] = peak_memory(run.fabric.device) / 2**30
    if logging.step_timing:
        shown["step_time"] = step_time
    return shown


def checkpoint_due(run: Run, done: int, index: int) -> bool:
    """Whether the save policy asks for a checkpoint after step `done` (`index` within its epoch), or
    it is the run's last step (a run that keeps checkpoints ends with one); every rank follows rank 0's
    clock for time intervals."""
    policy, checkpointer = run.plan.checkpoints.policy, run.checkpointer
    checkpointer.poll()
    elapsed = time.monotonic() - checkpointer.saved_at
    if policy.train_time_interval is not None:
        elapsed = run.fabric.broadcast(elapsed, src=0)
    epoch_end = policy.on_epoch_end and (index + 1 == run.steps_per_epoch or done == run.steps)
    return policy.due(done, elapsed) or epoch_end or (policy.keeps_any and done == run.steps)


def finish_uploads(run: Run, *, wait: bool) -> None:
    """Rank 0's checkpoint uploads: waited for, and those that failed named (training went on meanwhile: a
    failed upload never stops it), then UploadsFailed; or, when the run stops (`wait` False), those still
    running named."""
    if run.uploads is None:
        return
    uploads, run.uploads, where = run.uploads, None, run.plan.checkpoints.s3.url
    if not wait:
        if pending := uploads.pending:
            run.monitor.info(
                f"s3: the run stops before {', '.join(pending)} finished uploading to {where}; "
                f"they are only in {run.checkpointer.root}"
            )
        return
    if failed := uploads.close():
        message = (
            f"s3: {len(failed)} checkpoint(s) not uploaded to {where}: {', '.join(failed)}; they are only "
            f"in {run.checkpointer.root}, unless retention removed them"
        )
        run.monitor.info(message)
        raise UploadsFailed(f"{len(failed)} checkpoint(s) not uploaded to {where} (named above)")


def eval_sampler(run: Run, dataset: Dataset) -> PretrainingSampler:
    b = run.plan.batches
    return PretrainingSampler(
        len(dataset),
        b.global_batch_size,
        b.micro_batch_size,
        run.dims.dp,
        run.mesh.data_parallel_rank,
        seed=run.plan.launch.seed,
        drop_last=b.validation_drop_last,
        pad_to_global_batch=b.pad_to_global_batch,
    )


def save_checkpoint(run: Run, done: int, logged: dict[str, float]) -> None:
    """Everything needed to continue after optimizer step `done` (in the background when asynchronous)."""
    gbs, rank = run.plan.batches.global_batch_size, run.fabric.global_rank
    consumed = run.sampler.consumed_samples + run.drawn(done - run.start_step) * gbs
    progress = {"step": done, "consumed_samples": consumed}
    sampler = run.sampler.state_dict() | {"consumed_samples": consumed}
    extra = None if run.rollouts is None else {"rollouts": run.rollouts.state()}
    state = run.training.state(progress=progress, sampler=sampler, rng={f"rank{rank}": rng_states(extra)}, saving=True)
    run.checkpointer.save(
        state,
        step=done,
        consumed_samples=consumed,
        metrics=logged,
        extra=run.checkpoint_record,
        keep=done == run.steps,
    )  # the last step stays
