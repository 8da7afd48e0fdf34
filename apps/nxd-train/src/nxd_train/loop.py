"""The pretraining loop: Lightning Fabric launches the processes (its ddp strategy only sets up the
process group; nxd-parallel shards the model), then build, step, log and validate.

Loss normalisation: every micro-batch contributes the *sum* of its token losses, divided by the
number of non-ignored tokens in the whole global batch (all micro-batches of all data-parallel
ranks, all context-parallel parts). FSDP2 averages gradients over the data x context ranks, so each
rank scales its part by dp * cp. The result is the gradient of one big batch, whatever the layout
and the split into micro-batches. With pipeline parallelism the schedule runs the micro-batches
(`pipelining.py`) with the same normaliser; the losses live on the last stage and are summed over
the pipeline ranks.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import torch
import yaml
from lightning_fabric import Fabric
from nxd_ckpt import Checkpointer, CheckpointError, CheckpointInfo
from nxd_config import NxdConfig
from nxd_data import IGNORE_INDEX, PretrainingSampler, WithPadding, collate
from nxd_models import build_on_meta, causal_lm_logits, training_flops_per_token
from nxd_parallel import (
    ParallelDims,
    clip_gradients,
    global_norm,
    loss_parallel,
    set_gradient_sync,
    split_sequence,
    token_cross_entropy,
)
from nxd_precision import PrecisionOptimizer
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.utils.data import DataLoader, Dataset

from .checkpointing import (
    TrainingState,
    export_of,
    export_record,
    load_weights,
    restore_rng_states,
    rng_states,
    save_policy,
    versions,
)
from .data import DataSplits
from .logdir import CHECKPOINT_DIR, next_log_dir
from .monitor import Monitor
from .optimizers import build_optimizer
from .parallelism import StagedModel, build_parallel_model
from .pipelining import PipelineRunner
from .preflight import RunPlan, neuron_environment
from .schedules import build_scheduler
from .throughput import matmul_ceiling

NEURON_DEVICE_TYPES = ("neuron", "xla")
"""Device types of AWS Neuron cores, whose runtime reads the variables of `neuron_environment`."""


def micro_batches(dataset: Dataset, sampler: PretrainingSampler, data: DataSplits, num_workers: int) -> DataLoader:
    """This rank's micro-batches as `sampler` orders them, read by `num_workers` worker processes."""
    return DataLoader(WithPadding(dataset, data.format.padding()), batch_sampler=sampler, collate_fn=collate,
                      num_workers=num_workers)  # fmt: skip


def token_losses(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of every label position (0 where the label is ignored), from fp32 logits; logits
    sharded over the vocabulary (tensor parallel) are reduced without gathering them (call it, and
    run the backward, inside `loss_parallel()`)."""
    logits = causal_lm_logits(model, batch["input_ids"], batch["position_ids"], batch.get("document_ids"))
    return token_cross_entropy(logits, batch["labels"], IGNORE_INDEX)


def sum_over(tensor: torch.Tensor, *meshes: DeviceMesh | None) -> torch.Tensor:
    """`tensor` summed over the ranks of each 1-D mesh given (data, context, pipeline), in place."""
    for mesh in meshes:
        if mesh is not None:
            torch.distributed.all_reduce(tensor, group=mesh.get_group())
    return tensor


def label_count(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Non-ignored labels of a micro-batch, as a device tensor (no host synchronisation)."""
    return (batch["labels"] != IGNORE_INDEX).sum()


def batch_limit(limit: int | float, available: int) -> int:
    """Lightning's limit_*_batches: an int counts batches, a float is a fraction, -1 (sanity) is all."""
    if isinstance(limit, float):
        return int(available * limit)
    return available if limit < 0 else min(limit, available)


def total_steps(cfg: NxdConfig, steps_per_epoch: int) -> int:
    """max_steps and max_epochs, whichever ends first (-1 means unbounded)."""
    bounds = [cfg.trainer.max_steps] if cfg.trainer.max_steps > 0 else []
    if cfg.trainer.max_epochs > 0:
        bounds.append(cfg.trainer.max_epochs * steps_per_epoch)
    return min(bounds)


def validation_due(cfg: NxdConfig, global_step: int, epoch: int, index: int, steps_per_epoch: int) -> bool:
    """Lightning's cadence: an int val_check_interval counts steps (across epochs when
    check_val_every_n_epoch is null), a float is a fraction of each epoch."""
    interval, every = cfg.trainer.val_check_interval, cfg.trainer.check_val_every_n_epoch
    if isinstance(interval, int) and every is None:
        return (global_step + 1) % interval == 0
    if every is not None and (epoch + 1) % every:
        return False
    steps = interval if isinstance(interval, int) else max(1, int(interval * steps_per_epoch))
    return (index + 1) % steps == 0


def train(cfg: NxdConfig, plan: RunPlan) -> Path:
    """Run the job `plan` describes; returns the log directory."""
    fabric = Fabric(
        accelerator="auto", devices=cfg.trainer.devices, num_nodes=cfg.trainer.num_nodes,
        strategy="ddp" if cfg.world_size > 1 else "auto", precision=plan.precision,
    )  # fmt: skip
    fabric.launch()
    if fabric.device.type in NEURON_DEVICE_TYPES:
        os.environ.update(neuron_environment(cfg, os.environ))
    fabric.seed_everything(cfg.seed, verbose=False)
    ds = cfg.distributed_strategy
    dims = ParallelDims(fabric.world_size, tp=ds.tensor_model_parallel_size, pp=ds.pipeline_model_parallel_size,
                        cp=ds.context_parallel_size)  # fmt: skip
    mesh = dims.build_mesh(fabric.device.type)
    token_mesh, pp_mesh = mesh.get("dp_cp"), mesh.get("pp")  # tokens split over data and context ranks
    dp, cp, cp_rank, rank = dims.dp, dims.cp, mesh.rank("cp"), fabric.global_rank

    def on_device(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A micro-batch on the device; with context parallelism, this rank's part of each sequence."""
        batch = fabric.to_device(batch)
        if cp > 1:
            batch = {key: split_sequence(value, cp, cp_rank) for key, value in batch.items()}
        return batch

    log_dir = Path(fabric.broadcast(str(plan.log_dir or next_log_dir(cfg.exp_manager, cfg.name)) if rank == 0 else None,
                                    src=0))  # fmt: skip
    resume = fabric.broadcast(plan.resume, src=0)  # rank 0's choice, should a checkpoint appear meanwhile
    exp = cfg.exp_manager
    checkpoints_used = exp.create_checkpoint_callback or resume is not None
    checkpoint_group = (torch.distributed.new_group(backend="gloo")
                        if checkpoints_used and torch.distributed.is_initialized() else None)  # fmt: skip
    if rank == 0:
        resolved = yaml.safe_dump(cfg.model_dump(mode="json", by_alias=True), sort_keys=False)
        (log_dir / "config.yaml").write_text(resolved)

    gbs, mbs = cfg.global_batch_size, cfg.data.micro_batch_size
    data_options = dict(global_batch_size=gbs, micro_batch_size=mbs, data_parallel_size=dp,
                        data_parallel_rank=mesh.data_parallel_rank, seed=cfg.seed)  # fmt: skip
    cyclic = cfg.data.dataloader_type == "cyclic"
    train_sampler = PretrainingSampler(len(plan.data.train), **data_options, shuffle=cyclic or not plan.data.shuffled,
                                       reshuffle_each_epoch=cyclic)  # fmt: skip
    steps_per_epoch = train_sampler.steps_per_epoch
    steps = total_steps(cfg, steps_per_epoch)
    monitor = Monitor(log_dir, global_rank=rank, local_rank=fabric.local_rank, total_steps=steps,
                      local_rank_0_only=cfg.exp_manager.log_local_rank_0_only,
                      tensorboard=cfg.exp_manager.create_tensorboard_logger)  # fmt: skip

    model = build_parallel_model(plan.model, plan.attention, plan.layout, mesh, fabric.device, seed=cfg.seed,
                                 use_cpu_initialization=cfg.model.use_cpu_initialization,
                                 policy=plan.policy)  # fmt: skip
    export = export_of(plan.model)
    whole = build_on_meta(plan.model, plan.attention)  # shapes and counts of the whole model, whatever the layout
    accumulation = gbs // (mbs * dp)
    pipeline = (PipelineRunner(model, pp_mesh, fabric.device, accumulation)
                if isinstance(model, StagedModel) else None)  # fmt: skip

    def load_time(started: float) -> str:
        return f" in {time.perf_counter() - started:.2f} s" if exp.enable_recovery_time_instrumentation else ""

    if resume is not None and resume.weights_only:
        started = time.perf_counter()
        load_weights(model, resume, export, checkpoint_group, {k: v.shape for k, v in whole.state_dict().items()})
        monitor.info(f"initial weights from {resume.path}{load_time(started)}")
    flops_per_token = training_flops_per_token(whole, plan.seq_length)
    parameters = sum(p.numel() for p in whole.parameters())
    optim = cfg.model.optim
    optimizer = PrecisionOptimizer(model.parameters(), plan.policy, lambda tensors: build_optimizer(
        optim, tensors, decay_norms_and_biases=cfg.model.do_layer_norm_weight_decay))  # fmt: skip
    scheduler = build_scheduler(optimizer.optimizer, optim.sched, optim.lr or 0.0, steps)
    training = TrainingState(model, optimizer, scheduler,
                             use_master_weights=exp.checkpoint_callback_params.use_master_weights_in_ckpt,
                             save_bf16=exp.save_bf16)  # fmt: skip
    start_step, saved_rng = 0, None
    if resume is not None and not resume.weights_only:
        started = time.perf_counter()
        progress, sampler_state = {"step": 0, "consumed_samples": 0}, train_sampler.state_dict()
        rng = {f"rank{rank}": None} if resume.world_size == fabric.world_size else {}
        training.load(resume.path, progress=progress, sampler=sampler_state, rng=rng, process_group=checkpoint_group)
        try:
            train_sampler = train_sampler.resumed(sampler_state)
        except ValueError as error:
            raise CheckpointError(f"{resume.path}: {error}") from None
        start_step, saved_rng = progress["step"], rng.get(f"rank{rank}")
        if saved_rng is None:
            monitor.info(f"resuming on {fabric.world_size} processes from a checkpoint of {resume.world_size}: "
                         "random states start fresh (dropout masks differ from an uninterrupted run)")  # fmt: skip
        monitor.info(f"resumed from {resume.path} at step {start_step} ({progress['consumed_samples']} samples)"
                     f"{load_time(started)}")  # fmt: skip
    policy = save_policy(cfg)
    record = {"world_size": fabric.world_size, "layout": dims.sizes(), "versions": versions(),
              "config": cfg.model_dump(mode="json", by_alias=True), **export_record(export)}  # fmt: skip

    def report_save(info: CheckpointInfo, seconds: float) -> None:
        size = sum(info.files.values()) / 2**20
        monitor.info(f"checkpoint {info.path.name}: {size:.1f} MiB in {seconds:.2f} s")

    checkpointer = Checkpointer(log_dir / CHECKPOINT_DIR, policy, asynchronous=exp.async_checkpointing,
                                process_group=checkpoint_group, on_complete=report_save)  # fmt: skip

    def save_checkpoint(done: int, values: dict[str, float]) -> None:
        progress = {"step": done, "consumed_samples": train_sampler.consumed_samples + (done - start_step) * gbs}
        sampler = train_sampler.state_dict() | {"consumed_samples": progress["consumed_samples"]}
        state = training.state(progress=progress, sampler=sampler, rng={f"rank{rank}": rng_states()}, saving=True)
        checkpointer.save(state, step=done, consumed_samples=progress["consumed_samples"], metrics=values,
                          extra=record)  # fmt: skip
    ceiling = fabric.all_reduce(torch.tensor(matmul_ceiling(fabric.device, plan.policy.compute_dtype),
                                             device=fabric.device), reduce_op="sum").item()  # fmt: skip
    layout = " x ".join(f"{name} {size}" for name, size in dims.sizes().items() if size > 1) or "one process"
    monitor.info(f"nxd-train: {cfg.name}: {parameters:,} parameters, {fabric.world_size} process(es) ({layout}), "
                 f"global batch {gbs} "
                 f"({gbs // (mbs * dp)} x {mbs} per rank), {steps} steps of {steps_per_epoch} per epoch, "
                 f"{plan.data.tokenizer}; logs in {log_dir}")  # fmt: skip

    def evaluate(dataset: Dataset | None, limit: int | float) -> float | None:
        if dataset is None:
            return None
        sampler = PretrainingSampler(len(dataset), **data_options, drop_last=cfg.data.validation_drop_last,
                                     pad_to_global_batch=cfg.data.pad_samples_to_global_batch_size)  # fmt: skip
        count = batch_limit(limit, sampler.steps_per_epoch)
        if count == 0:
            return None
        model.eval()
        loss = torch.zeros((), device=fabric.device, dtype=torch.float64)
        tokens = torch.zeros((), device=fabric.device, dtype=torch.float64)
        batches = iter(micro_batches(dataset, replace(sampler, steps=count), plan.data, cfg.data.num_workers))
        with torch.no_grad():
            for _ in range(count):
                step_batches = [on_device(next(batches)) for _ in range(accumulation)]
                with fabric.autocast():
                    if pipeline is not None:
                        loss += pipeline.evaluate(step_batches)
                    else:
                        with loss_parallel():
                            loss += sum(token_losses(model, batch).double().sum() for batch in step_batches)
                tokens += sum(label_count(batch) for batch in step_batches)
        model.train()
        return (sum_over(loss, token_mesh, pp_mesh) / sum_over(tokens, token_mesh)).item()

    if cfg.trainer.num_sanity_val_steps:
        sanity = evaluate(plan.data.validation, cfg.trainer.num_sanity_val_steps)
        if sanity is not None:
            monitor.info(f"sanity check: val_loss {sanity:.4f}")

    model.train()
    train_batches = iter(micro_batches(plan.data.train, replace(train_sampler, steps=steps - start_step), plan.data,
                                       cfg.data.num_workers))  # fmt: skip
    if saved_rng is not None:
        restore_rng_states(saved_rng)  # now that the data loader has drawn its seed, as at the save
    window_time, window_steps = 0.0, 0  # training time since the last log line (validation excluded)
    logged: dict[str, float] = {}  # the latest value of everything logged, for checkpoint names and ranking
    for step in range(start_step, steps):
        started = time.perf_counter()
        epoch, index = divmod(step, steps_per_epoch)
        batches = [on_device(next(train_batches)) for _ in range(accumulation)]
        tokens = sum_over(sum(label_count(batch) for batch in batches).float(), token_mesh)
        loss = torch.zeros((), device=fabric.device, dtype=torch.float64)
        if pipeline is not None:
            with fabric.autocast():
                loss += pipeline.step(batches, dp * cp / tokens.item())
        else:
            for number, batch in enumerate(batches, start=1):
                set_gradient_sync(model, number == accumulation)  # reduce gradients once, after the last one
                with loss_parallel():
                    with fabric.autocast():
                        losses = token_losses(model, batch)
                    (losses.sum() * (dp * cp) / tokens).backward()
                loss += losses.detach().double().sum()  # reported in fp64: no rounding of a large fp32 sum
        optimizer.collect_gradients()
        grad_norm = _gradient_norm(optimizer.gradient_tensors, cfg, pp_mesh)
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        loss = (sum_over(loss, token_mesh, pp_mesh) / tokens).item()
        logged.update(loss=loss, lr=lr, epoch=epoch)
        if grad_norm is not None:
            logged["grad_norm"] = grad_norm
        window_time += time.perf_counter() - started
        window_steps += 1
        monitor.advance()

        done = step + 1
        if done % cfg.trainer.log_every_n_steps == 0 or done == steps:
            step_time = window_time / window_steps
            processed = gbs * plan.seq_length
            values = {"loss": loss, "lr": lr, "epoch": epoch, "consumed_samples": done * gbs}
            if grad_norm is not None and cfg.exp_manager.log_gradient_norm:
                values["grad_norm"] = grad_norm
            if cfg.exp_manager.log_parameter_norm:
                values["param_norm"] = global_norm((p.detach() for p in model.parameters()),
                                                   None if pp_mesh is None else pp_mesh.get_group()).item()  # fmt: skip
            values.update(tokens_per_s=processed / step_time, samples_per_s=gbs / step_time,
                          mfu=flops_per_token * processed / step_time / ceiling)  # fmt: skip
            if cfg.exp_manager.log_step_timing:
                values["step_time"] = step_time
            monitor.metrics(done, values)
            window_time, window_steps = 0.0, 0
        if validation_due(cfg, step, epoch, index, steps_per_epoch):
            val_loss = evaluate(plan.data.validation, cfg.trainer.limit_val_batches)
            if val_loss is not None:
                monitor.metrics(done, {"val_loss": val_loss})
                logged["val_loss"] = val_loss
        if exp.create_checkpoint_callback:
            checkpointer.poll()
            elapsed = time.monotonic() - checkpointer.saved_at
            if policy.train_time_interval is not None:  # every rank follows rank 0's clock
                elapsed = fabric.broadcast(elapsed, src=0)
            epoch_end = policy.on_epoch_end and (index + 1 == steps_per_epoch or done == steps)
            last = policy.save_last and done == steps
            if policy.due(done, elapsed) or epoch_end or last:
                save_checkpoint(done, logged)

    checkpointer.wait()
    test_loss = evaluate(plan.data.test, cfg.trainer.limit_test_batches)
    if test_loss is not None:
        monitor.metrics(steps, {"test_loss": test_loss})
    monitor.info(f"done: {steps} steps; logs in {log_dir}")
    monitor.close()
    fabric.barrier()
    return log_dir


def _gradient_norm(tensors: list[torch.Tensor], cfg: NxdConfig, pp_mesh: DeviceMesh | None) -> float | None:
    """Clip the gradients of `tensors` (the ones the optimizer steps on) to gradient_clip_val (null or 0:
    no clipping) and return the norm before clipping: the global one, over every tensor- and
    data-parallel shard and pipeline stage, as one process would compute it."""
    clip, stages = cfg.trainer.gradient_clip_val, None if pp_mesh is None else pp_mesh.get_group()
    if clip:
        return clip_gradients(tensors, clip, stages).item()
    if cfg.exp_manager.log_gradient_norm:
        return global_norm((t.grad for t in tensors if t.grad is not None), stages).item()
    return None
