"""A run set up from its plan, in one pass from top to bottom: the launcher's world (Lightning Fabric:
processes, accelerator, seeding), the device mesh, the log directory, the data order and monitor, the
sharded model with its initial weights and how a step executes on it, the optimizer and LR schedule,
the checkpointer, and the state it continues from (`restore`).
"""

from __future__ import annotations

import logging as logging_module
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import torch
import yaml
from lightning_fabric import Fabric
from lightning_fabric.plugins.environments import LightningEnvironment
from nxd_align import LoraFamily
from nxd_ckpt import (
    LORA_RECORD,
    Checkpointer,
    CheckpointInfo,
    CheckpointUploader,
    continued_lineage,
    read_info,
    write_adapter_files,
)
from nxd_data import PretrainingSampler, save_atomically
from nxd_models import device_ceiling, set_aux_loss_weights
from nxd_parallel import (
    ParallelDims,
    ParallelMesh,
    StagedModel,
    build_executor,
    build_parallel_model,
    keep_freed_host_memory,
    modules_of,
)
from nxd_precision import LossScaler, PrecisionOptimizer, build_optimizer, build_scheduler, prepare_parameters
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from nxd_train.cluster.environment import LaunchedEnvironment, RoundStrategy
from nxd_train.cluster.peers import PeerWatch
from nxd_train.cluster.peers import current as current_watch
from nxd_train.logging.log_dir import CHECKPOINT_DIR, LogDirError, LogDirLock, hold_log_dir, record_launch
from nxd_train.logging.monitor import RANK_LOGS, Monitor, rank_log_name
from nxd_train.run.checkpointing import HEAD_RECORD, Resume, export_of, fresh_prefixes, start_new_soft_prompt
from nxd_train.run.identity import IDENTITY
from nxd_train.run.plan import RunPlan
from nxd_train.run.profiling import StepProfiler
from nxd_train.run.restore import load_initial_weights, restore
from nxd_train.run.state import Run, forward_autocast
from nxd_train.run.statistics import StepStatistics
from nxd_train.run.trainer_outputs import TrainerOutputs
from nxd_train.run.training_state import TrainingState, export_record, versions

NEURON_DEVICE_TYPES = ("neuron", "xla")
"""Device types of AWS Neuron cores, whose runtime reads the plan's Neuron variables."""


class _NoMatmulPrecisionNotice(logging_module.Filter):
    """Drops Lightning's advice to set the fp32 matmul precision: precision.fp32_matmul_precision sets it."""

    def filter(self, record: logging_module.LogRecord) -> bool:
        return "set_float32_matmul_precision" not in record.getMessage()


def setup(plan: RunPlan) -> Run:
    """Launch the processes and build everything the loop needs, resumed where the plan says. It reads in
    the order a run stands up: the launcher's world, the device mesh, the log directory, the data order,
    the model with its initial weights, the update, the checkpointer, the state it continues from."""
    fabric = launch_processes(plan)
    dims = replace(plan.launch.parallel, world_size=fabric.world_size)  # the launched world (checked: the same)
    mesh = dims.build_mesh(fabric.device.type)
    log_dir, lock = _hold_log_dir(plan, fabric)
    if (watch := current_watch()) is not None:  # a silent peer's stop writes this rank's stacks beside its log
        watch.stacks_file = log_dir / rank_log_name(fabric.global_rank, fabric.local_rank)
        watch.stacks_pattern = str(log_dir / RANK_LOGS)
    try:
        run = _build(plan, fabric, dims, mesh, log_dir)
    except BaseException:
        lock.release()
        raise
    run.log_dir_lock = lock
    return run


def launch_processes(plan: RunPlan) -> Fabric:
    """The processes: the launcher's world (or those Fabric starts itself), their default group, seeded."""
    launch = plan.launch
    if torch.cuda.is_available():  # the documented policy, said in the log (Lightning's own notice is dropped)
        torch.set_float32_matmul_precision(launch.fp32_matmul_precision)
        logging_module.getLogger("lightning_fabric.utilities.rank_zero").addFilter(_NoMatmulPrecisionNotice())
    strategy, timeout = "auto", timedelta(seconds=launch.collective_timeout)
    # the launcher's world, or processes Fabric starts itself (never Fabric's own guess at a cluster, which would
    # take a Slurm batch script's single process for a task of an srun step)
    plugins = [LightningEnvironment() if launch.world is None else LaunchedEnvironment(launch.world)]
    if launch.world_size > 1:  # the offloaded shards' reductions (the gradient norm) run on the host
        offloaded = plan.layout.cpu_offload and torch.cuda.is_available()
        strategy = RoundStrategy(
            launch.world, process_group_backend="cuda:nccl,cpu:gloo" if offloaded else None, timeout=timeout
        )
    with warnings.catch_warnings():
        # Lightning's hint to prepend `srun` whenever srun is on the PATH: the launch is already decided (the
        # launcher's world, checked by launcher_check, or processes Fabric starts), and `nxd-train launch` writes
        # the srun line a Slurm job needs
        warnings.filterwarnings("ignore", message="The `srun` command is available")
        fabric = Fabric(
            accelerator="auto",
            devices=launch.devices,
            num_nodes=launch.num_nodes,
            strategy=strategy,
            precision=plan.precision,
            plugins=plugins,
        )
        fabric.launch()
    if fabric.world_size > 1:
        PeerWatch(fabric.global_rank, fabric.world_size, launch.collective_timeout, fabric.strategy.watch_store).start()
    if fabric.device.type in NEURON_DEVICE_TYPES:
        os.environ.update(launch.neuron_environment)
    fabric.seed_everything(launch.seed, verbose=False)
    return fabric


def _hold_log_dir(plan: RunPlan, fabric: Fabric) -> tuple[Path, LogDirLock]:
    """The run's log directory, created and held by rank 0 (a resumed run's, or a new one); a LogDirError
    on every rank when another run holds it or it cannot be written."""
    logging, lock, held = plan.logging, LogDirLock(None), None
    if fabric.global_rank == 0:
        try:
            path, lock = hold_log_dir(
                logging.explicit_log_dir,
                logging.exp_dir,
                logging.exp_name,
                plan.log_dir,
                written=(logging.json_log_file,) if logging.json_log_file else (),
            )
            if plan.launch.job is not None:
                record_launch(path, plan.launch.job.tag)  # a restarted round finds this folder
            held = (str(path), None)
        except LogDirError as error:
            held = (None, str(error))
    path, problem = fabric.broadcast(held, src=0)
    if problem is not None:
        raise LogDirError(problem)
    return Path(path), lock


def _build(plan: RunPlan, fabric: Fabric, dims: ParallelDims, mesh: ParallelMesh, log_dir: Path) -> Run:
    """Everything the loop needs, in the held log directory, resumed where the plan says."""
    launch, rank = plan.launch, fabric.global_rank
    host_memory = keep_freed_host_memory() if launch.keep_freed_host_memory and fabric.device.type == "cpu" else None
    resume = fabric.broadcast(plan.resume, src=0)  # rank 0's choice, should a checkpoint appear meanwhile
    if rank == 0:
        save_atomically(log_dir / "config.yaml", yaml.safe_dump(plan.resolved_config, sort_keys=False).encode())
    sampler = _sampler(plan, dims, mesh)
    steps = plan.cadence.total_steps(sampler.steps_per_epoch)
    monitor = _monitor(plan, fabric, log_dir, steps, resume)
    group = None  # checkpoints' own gloo group: saves and loads never queue behind the training collectives
    if (plan.checkpoints.enabled or resume is not None) and torch.distributed.is_initialized():
        group = torch.distributed.new_group(backend="gloo", timeout=timedelta(seconds=launch.collective_timeout))
    model = _model(plan, fabric, mesh, resume)
    set_aux_loss_weights(modules_of(model), sampler.accumulation)
    if resume is not None and resume.weights_only:  # before the optimizer copies the weights
        load_initial_weights(plan, model, resume, group, monitor)
    if resume is None or resume.weights_only:
        start_new_soft_prompt(model, plan.family, resume)
    executor = build_executor(
        model,
        plan.family.token_losses,
        fabric.device,
        pp=mesh.get("pp"),
        microbatches=sampler.accumulation,
        autocast=forward_autocast(fabric, plan.policy),
    )
    update, lora = plan.update, plan.lora
    trained = [name for name, p in model.named_parameters() if p.requires_grad]
    scales = plan.family.optimizer_scales(trained, update.optimizer)  # muP's, where the model has them
    optimizer = PrecisionOptimizer(
        model.parameters(),
        plan.policy,
        lambda tensors: build_optimizer(
            update.optimizer,
            tensors,
            update.options,
            decay_norms_and_biases=update.decay_norms_and_biases,
            scales=scales,
            fp32_state=plan.family.fp32_state_parameters(trained),
        ),
    )
    scheduler = build_scheduler(optimizer.optimizer, update.schedule, update.schedule_options, update.lr, steps)
    scaler = None if update.loss_scaling is None else LossScaler(update.loss_scaling)
    training = TrainingState(
        model,
        optimizer,
        scheduler,
        use_master_weights=plan.checkpoints.use_master_weights,
        save_bf16=plan.checkpoints.save_bf16,
        lora=lora,
        lora_base=None if plan.adapters is None else plan.adapters.base,
        scaler=scaler,
    )
    trainer_outputs = None
    if plan.logging.trainer_checkpoints and rank == 0:
        trainer_outputs = TrainerOutputs(
            log_dir,
            {
                "max_steps": steps,
                "logging_steps": plan.cadence.log_every_n_steps,
                "train_batch_size": plan.batches.micro_batch_size,
            },
            monitor.info,
        )
    attach = _adapter_writers(plan)
    uploads = None
    if plan.checkpoints.s3 is not None and rank == 0:
        uploads = CheckpointUploader(plan.checkpoints.s3, log_dir.name, monitor.info)
    checkpointer = _checkpointer(plan, log_dir, resume, group, monitor, trainer_outputs, attach, uploads)
    ceiling = device_ceiling(fabric.device, plan.policy.compute_dtype)
    ceiling.flops = fabric.all_reduce(torch.tensor(ceiling.flops, device=fabric.device), reduce_op="sum").item()
    run = Run(
        plan,
        fabric,
        dims,
        mesh,
        log_dir,
        monitor,
        model,
        executor,
        optimizer,
        scheduler,
        training,
        sampler,
        checkpointer,
        _checkpoint_record(plan, fabric, dims),
        steps,
        flops_per_token=plan.family.flops_per_token(plan.seq_length),
        ceiling=ceiling,
        objective=plan.objective.split_over(_group(mesh.get("cp"))),
        train_data=plan.data.train,
        validation_data=plan.data.validation,
        test_data=plan.data.test,
        padding=plan.data.padding,
        attach=attach,
        checkpoint_group=group,
        scaler=scaler,
        trainer_outputs=trainer_outputs,
        uploads=uploads,
    )
    if (window := plan.logging.profiler) is not None:
        run.profiler = StepProfiler(window, log_dir, fabric.device, rank, monitor.info)
    if plan.logging.statistics.any:
        run.statistics = StepStatistics(
            plan.logging.statistics, training.names, plan.batches.global_batch_size, _group(mesh.get("pp"))
        )
    restore(run, resume)
    _announce(run, resume, host_memory)
    return run


def _sampler(plan: RunPlan, dims: ParallelDims, mesh: ParallelMesh) -> PretrainingSampler:
    """The order of the training samples over the data-parallel ranks, from the run's start."""
    b = plan.batches
    lengths = plan.data.train.row_lengths.tobytes() if b.group_by_length else None  # fine-tuning records only
    return PretrainingSampler(
        len(plan.data.train),
        b.global_batch_size,
        b.micro_batch_size,
        dims.dp,
        mesh.data_parallel_rank,
        seed=plan.launch.seed,
        shuffle=b.reshuffle_each_epoch or not plan.data.shuffled,
        reshuffle_each_epoch=b.reshuffle_each_epoch,
        lengths=lengths,
    )


def _monitor(plan: RunPlan, fabric: Fabric, log_dir: Path, steps: int, resume: Resume | None) -> Monitor:
    """The run's logs and loggers; a continued run keeps the rows its checkpoint covers."""
    logging = plan.logging
    continues_here = resume is not None and not resume.weights_only and plan.log_dir is not None
    return Monitor(
        log_dir,
        global_rank=fabric.global_rank,
        local_rank=fabric.local_rank,
        total_steps=steps,
        local_rank_0_only=logging.local_rank_0_only,
        tensorboard=logging.tensorboard,
        continue_after=read_info(resume.path).step if continues_here else None,
        wandb=logging.wandb,
        comet=logging.comet,
        config=plan.resolved_config,
        json_log_file=logging.json_log_file,
    )


def _model(plan: RunPlan, fabric: Fabric, mesh: ParallelMesh, resume: Resume | None) -> nn.Module | StagedModel:
    """The sharded model, seeded; the weights a weight_init_only start loads are not initialised first."""
    starts_loaded = resume is not None and resume.weights_only and plan.lora is None  # no random values to draw
    kept = fresh_prefixes(plan.family, resume) if starts_loaded else ()  # initialised, not loaded
    loaded = [name for name in plan.family.parameter_shapes() if not name.startswith(kept)] if starts_loaded else ()
    return sharded_model(plan, fabric, mesh, loaded)


def sharded_model(
    plan: RunPlan, fabric: Fabric, mesh: ParallelMesh, loaded: Sequence[str] = ()
) -> nn.Module | StagedModel:
    """The plan's model built in its layout over `mesh`, seeded, its parameters in the plan's precision; the names in
    `loaded` are left for a checkpoint to fill (not drawn)."""
    return build_parallel_model(
        plan.family,
        plan.layout,
        mesh,
        fabric.device,
        seed=plan.launch.seed,
        use_cpu_initialization=plan.launch.use_cpu_initialization,
        prepare=partial(prepare_parameters, policy=plan.policy),
        loaded=loaded,
    )


def _adapter_writers(plan: RunPlan) -> list[Callable[[Path], None]]:
    """peft's adapter folder inside each checkpoint, when the config asks for its files."""
    adapters, lora = plan.adapters, plan.lora
    if lora is None or not (adapters.config_file or adapters.single_file):
        return []
    export = lora.adapter_export()

    def adapter_files(folder: Path) -> None:
        write_adapter_files(folder, export, weights_from=folder if adapters.single_file else None)

    return [adapter_files]


def _checkpointer(
    plan: RunPlan,
    log_dir: Path,
    resume: Resume | None,
    group: torch.distributed.ProcessGroup | None,
    monitor: Monitor,
    trainer_outputs: TrainerOutputs | None,
    attach: list[Callable[[Path], None]],
    uploads: CheckpointUploader | None,
) -> Checkpointer:
    """The saves of this run, in its log directory; a continued run's lineage goes on from the resumed one.
    Rank 0 hands each complete one to `uploads` (S3)."""

    def report_save(info: CheckpointInfo, seconds: float) -> None:
        monitor.info(f"checkpoint {info.path.name}: {sum(info.files.values()) / 2**20:.1f} MiB in {seconds:.2f} s")
        if trainer_outputs is not None:
            trainer_outputs.saved(info)
        if uploads is not None and info.path.is_dir():  # retention may have removed it at once (not in its top k)
            uploads.submit(info.path)

    continued = resume is not None and not resume.weights_only
    return Checkpointer(
        log_dir / CHECKPOINT_DIR,
        plan.checkpoints.policy,
        asynchronous=plan.checkpoints.asynchronous,
        process_group=group,
        on_complete=report_save,
        attach=partial(_write_all, attach),
        lineage=continued_lineage(log_dir / CHECKPOINT_DIR, resume.path) if continued else None,
        resumed_from=None if resume is None else resume.path,
    )


def _checkpoint_record(plan: RunPlan, fabric: Fabric, dims: ParallelDims) -> dict[str, Any]:
    """What every checkpoint's marker records of the run (layout, versions, config, Hugging Face mapping)."""
    export = export_of(plan.family, plan.data.tokenizer_files, plan.data.pad_id)
    record = {
        "world_size": fabric.world_size,
        "layout": dims.sizes(),
        "versions": versions(),
        "config": plan.resolved_config,
        IDENTITY: plan.identity,
        **export_record(export),
        HEAD_RECORD: plan.family.head,
    }
    if plan.lora is not None:
        record[LORA_RECORD] = plan.lora.adapter_export() | {"base": plan.adapters.base}
    return record


def _announce(run: Run, resume: Resume | None, host_memory: str | None) -> None:
    """The run's start lines: what trains on what, its data, the MFU ceiling, adapters, a restart's round."""
    plan, monitor, fabric, b = run.plan, run.monitor, run.fabric, run.plan.batches
    layout = " x ".join(f"{name} {size}" for name, size in run.dims.sizes().items() if size > 1) or "one process"
    monitor.info(
        f"nxd-train: {plan.logging.name}: {plan.family.parameter_count():,} parameters, {fabric.world_size} "
        f"process(es) ({layout}), {plan.objective.name}, global batch {b.global_batch_size} "
        f"({run.sampler.accumulation} x {b.micro_batch_size} per rank), {run.steps} steps of "
        f"{run.sampler.steps_per_epoch} per epoch, {plan.data.tokenizer}; logs in {run.log_dir}"
    )
    for line in (*plan.data.notes, *([host_memory] if host_memory else [])):
        monitor.info(line)
    monitor.info(
        f"MFU: model FLOPs (attention counted in full, not causal) against {run.ceiling.source}, per "
        f"device; fp32 matmul precision {torch.get_float32_matmul_precision()}"
    )
    if plan.lora is not None:
        _report_adapters(plan.lora, run.model, plan, monitor)
    if (job := plan.launch.job) is not None and job.restart:
        continued = resume is not None and not resume.weights_only
        where = (
            f"resumed at step {run.start_step} from {resume.path}"
            if continued
            else "no complete checkpoint to resume from, so training starts at step 0"
        )
        monitor.info(f"{job.says()}: {where}")


def _group(mesh: DeviceMesh | None) -> torch.distributed.ProcessGroup | None:
    return None if mesh is None else mesh.get_group()


def _write_all(writers: list[Callable[[Path], None]], folder: Path) -> None:
    """Every writer's files into a checkpoint folder."""
    for write in writers:
        write(folder)


def _report_adapters(lora: LoraFamily, model: nn.Module | StagedModel, plan: RunPlan, monitor: Monitor) -> None:
    """The trainable share of the model; with lora_verbose, every adapted layer."""
    s = lora.spec
    monitor.info(
        f"LoRA r={s.rank} alpha={s.alpha:g} on {len(lora.modules)} layers: {lora.trainable_count():,} adapter "
        f"parameters ({lora.trainable_count() / plan.family.parameter_count():.2%} of the base model)"
    )
    if plan.adapters.verbose:
        for name in lora.modules:
            monitor.info(f"  LoRA {name}")
        trained = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
        monitor.info(
            f"  trainable on this rank: {len(trained)} tensors, "
            f"{sum(p.numel() for p in model.parameters() if p.requires_grad):,} values"
        )
