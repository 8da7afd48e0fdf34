"""A run set up from its plan: processes (Lightning Fabric: launch, accelerator, seeding), the device
mesh, the log directory and monitor, the sharded model and how a step executes on it, the optimizer
and LR schedule, the sampler, the checkpointer, and where a resumed run starts.
"""

from __future__ import annotations

import logging as logging_module
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from functools import partial
from pathlib import Path

import torch
import yaml
from lightning_fabric import Fabric
from lightning_fabric.plugins.environments import LightningEnvironment
from nxd_align import LoraFamily
from nxd_ckpt import (
    Checkpointer,
    CheckpointError,
    CheckpointInfo,
    continued_lineage,
    read_info,
    write_adapter_files,
)
from nxd_data import PretrainingSampler
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
from nxd_precision import (
    LossScaler,
    PrecisionOptimizer,
    apply_options,
    apply_schedule,
    build_optimizer,
    build_scheduler,
    prepare_parameters,
)
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from .checkpointing import (
    HEAD_RECORD,
    LORA_RECORD,
    OUTPUT_LAYER,
    Resume,
    TrainingState,
    export_of,
    export_record,
    holds_frozen_base,
    load_adapters,
    load_weights,
    loads_output_layer,
    versions,
)
from .cluster import LaunchedEnvironment, RoundStrategy
from .logdir import CHECKPOINT_DIR, LogDirError, LogDirLock, hold_log_dir, record_launch
from .monitor import RANK_LOGS, Monitor, rank_log_name
from .peers import PeerWatch
from .peers import current as current_watch
from .plan import RunPlan
from .reference import prepare_reference
from .resume_check import IDENTITY
from .run_state import Run
from .trainer_outputs import TrainerOutputs

NEURON_DEVICE_TYPES = ("neuron", "xla")
"""Device types of AWS Neuron cores, whose runtime reads the plan's Neuron variables."""
class _NoMatmulPrecisionNotice(logging_module.Filter):
    """Drops Lightning's advice to set the fp32 matmul precision: precision.fp32_matmul_precision sets it."""

    def filter(self, record: logging_module.LogRecord) -> bool:
        return "set_float32_matmul_precision" not in record.getMessage()


def setup(plan: RunPlan) -> Run:
    """Launch the processes and build everything the loop needs, resumed where the plan says."""
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
        strategy = RoundStrategy(launch.world, process_group_backend="cuda:nccl,cpu:gloo" if offloaded else None,
                                 timeout=timeout)  # fmt: skip
    fabric = Fabric(accelerator="auto", devices=launch.devices, num_nodes=launch.num_nodes, strategy=strategy,
                    precision=plan.precision, plugins=plugins)  # fmt: skip
    fabric.launch()
    if fabric.world_size > 1:
        PeerWatch(fabric.global_rank, fabric.world_size, launch.collective_timeout, fabric.strategy.watch_store).start()
    if fabric.device.type in NEURON_DEVICE_TYPES:
        os.environ.update(launch.neuron_environment)
    host_memory = keep_freed_host_memory() if launch.keep_freed_host_memory and fabric.device.type == "cpu" else None
    fabric.seed_everything(launch.seed, verbose=False)
    dims = ParallelDims(fabric.world_size, tp=launch.tp, pp=launch.pp, cp=launch.cp, ep=launch.ep)
    mesh = dims.build_mesh(fabric.device.type)
    log_dir, lock = _hold_log_dir(plan, fabric)
    if (watch := current_watch()) is not None:  # a silent peer's stop writes this rank's stacks beside its log
        watch.stacks_file = log_dir / rank_log_name(fabric.global_rank, fabric.local_rank)
        watch.stacks_pattern = str(log_dir / RANK_LOGS)
    try:
        run = _build(plan, fabric, dims, mesh, log_dir, host_memory)
    except BaseException:
        lock.release()
        raise
    run.log_dir_lock = lock
    return run


def _hold_log_dir(plan: RunPlan, fabric: Fabric) -> tuple[Path, LogDirLock]:
    """The run's log directory, created and held by rank 0 (a resumed run's, or a new one); a LogDirError
    on every rank when another run holds it or it cannot be written."""
    logging, lock, held = plan.logging, LogDirLock(None), None
    if fabric.global_rank == 0:
        try:
            path, lock = hold_log_dir(logging.explicit_log_dir, logging.exp_dir, logging.exp_name, plan.log_dir)
            if plan.launch.job is not None:
                record_launch(path, plan.launch.job.tag)  # a restarted round finds this folder
            held = (str(path), None)
        except LogDirError as error:
            held = (None, str(error))
    path, problem = fabric.broadcast(held, src=0)
    if problem is not None:
        raise LogDirError(problem)
    return Path(path), lock


def _build(plan: RunPlan, fabric: Fabric, dims: ParallelDims, mesh: ParallelMesh, log_dir: Path,
           host_memory: str | None) -> Run:  # fmt: skip
    """Everything the loop needs, in the held log directory, resumed where the plan says."""
    launch, rank, logging = plan.launch, fabric.global_rank, plan.logging
    resume = fabric.broadcast(plan.resume, src=0)  # rank 0's choice, should a checkpoint appear meanwhile
    if rank == 0:
        (log_dir / "config.yaml").write_text(yaml.safe_dump(plan.resolved_config, sort_keys=False))

    b = plan.batches
    sampler = PretrainingSampler(len(plan.data.train), b.global_batch_size, b.micro_batch_size, dims.dp,
                                 mesh.data_parallel_rank, seed=launch.seed,
                                 shuffle=b.reshuffle_each_epoch or not plan.data.shuffled,
                                 reshuffle_each_epoch=b.reshuffle_each_epoch,
                                 lengths=_lengths(plan) if b.group_by_length else None)  # fmt: skip
    steps = plan.cadence.total_steps(sampler.steps_per_epoch)
    continues_here = resume is not None and not resume.weights_only and plan.log_dir is not None
    monitor = Monitor(log_dir, global_rank=rank, local_rank=fabric.local_rank, total_steps=steps,
                      local_rank_0_only=logging.local_rank_0_only, tensorboard=logging.tensorboard,
                      continue_after=read_info(resume.path).step if continues_here else None,
                      wandb=logging.wandb, config=plan.resolved_config,
                      json_log_file=logging.json_log_file)  # fmt: skip
    starts_loaded = resume is not None and resume.weights_only and plan.lora is None  # no random values to draw
    kept = () if not starts_loaded or loads_output_layer(plan.family, resume) else (OUTPUT_LAYER,)  # initialised
    loaded = [name for name in plan.family.parameter_shapes() if not name.startswith(kept)] if starts_loaded else ()
    model = build_parallel_model(plan.family, plan.layout, mesh, fabric.device, seed=launch.seed,
                                 use_cpu_initialization=launch.use_cpu_initialization,
                                 prepare=partial(prepare_parameters, policy=plan.policy), loaded=loaded)  # fmt: skip
    set_aux_loss_weights(modules_of(model), sampler.accumulation)
    checkpoint_group = None
    if (plan.checkpoints.enabled or resume is not None) and torch.distributed.is_initialized():
        checkpoint_group = torch.distributed.new_group(backend="gloo",
                                                       timeout=timedelta(seconds=launch.collective_timeout))
    if resume is not None and resume.weights_only:  # before the optimizer copies the weights
        _load_weights(plan, model, resume, checkpoint_group, monitor)
    executor = build_executor(model, plan.family.token_losses, fabric.device, pp=mesh.get("pp"),
                              microbatches=sampler.accumulation, autocast=fabric.autocast)  # fmt: skip
    update = plan.update
    optimizer = PrecisionOptimizer(model.parameters(), plan.policy, lambda tensors: build_optimizer(
        update.optimizer, tensors, update.options, decay_norms_and_biases=update.decay_norms_and_biases))  # fmt: skip
    scheduler = build_scheduler(optimizer.optimizer, update.schedule, update.schedule_options, update.lr, steps)
    lora = plan.lora
    scaler = None if update.loss_scaling is None else LossScaler(update.loss_scaling)
    training = TrainingState(model, optimizer, scheduler, use_master_weights=plan.checkpoints.use_master_weights,
                             save_bf16=plan.checkpoints.save_bf16, lora=lora,
                             lora_base=None if plan.adapters is None else plan.adapters.base,
                             scaler=scaler)  # fmt: skip

    trainer_outputs = None
    if logging.trainer_checkpoints and rank == 0:
        trainer_outputs = TrainerOutputs(log_dir, {"max_steps": steps, "logging_steps": plan.cadence.log_every_n_steps,
                                                   "train_batch_size": plan.batches.micro_batch_size},
                                         monitor.info)  # fmt: skip

    def report_save(info: CheckpointInfo, seconds: float) -> None:
        monitor.info(f"checkpoint {info.path.name}: {sum(info.files.values()) / 2**20:.1f} MiB in {seconds:.2f} s")
        if trainer_outputs is not None:
            trainer_outputs.saved(info)

    adapters, attach = plan.adapters, []
    adapter_export = None if lora is None else lora.adapter_export()
    if lora is not None and (adapters.config_file or adapters.single_file):

        def adapter_files(folder: Path) -> None:  # peft's adapter folder inside each checkpoint
            write_adapter_files(folder, adapter_export, weights_from=folder if adapters.single_file else None)

        attach.append(adapter_files)

    continued = resume is not None and not resume.weights_only
    checkpointer = Checkpointer(log_dir / CHECKPOINT_DIR, plan.checkpoints.policy,
                                asynchronous=plan.checkpoints.asynchronous, process_group=checkpoint_group,
                                on_complete=report_save, attach=partial(_write_all, attach),
                                lineage=continued_lineage(log_dir / CHECKPOINT_DIR, resume.path) if continued else None,
                                resumed_from=None if resume is None else resume.path)  # fmt: skip
    ceiling = device_ceiling(fabric.device, plan.policy.compute_dtype)
    ceiling.flops = fabric.all_reduce(torch.tensor(ceiling.flops, device=fabric.device), reduce_op="sum").item()
    export = export_of(plan.family, plan.data.tokenizer_files, plan.data.pad_id)
    record = {"world_size": fabric.world_size, "layout": dims.sizes(), "versions": versions(),
              "config": plan.resolved_config, IDENTITY: plan.identity, **export_record(export),
              HEAD_RECORD: plan.family.head}  # fmt: skip
    if lora is not None:
        record[LORA_RECORD] = adapter_export | {"base": plan.adapters.base}
    run = Run(plan, fabric, dims, mesh, log_dir, monitor, model, executor, optimizer, scheduler, training, sampler,
              checkpointer, record, steps, flops_per_token=plan.family.flops_per_token(plan.seq_length),
              ceiling=ceiling, objective=plan.objective.split_over(_group(mesh.get("cp"))),
              train_data=plan.data.train, validation_data=plan.data.validation,
              test_data=plan.data.test, padding=plan.data.padding,
              attach=attach, checkpoint_group=checkpoint_group, scaler=scaler,
              trainer_outputs=trainer_outputs)  # fmt: skip
    if plan.reference is not None:  # from the initial weights, before a resume loads trained ones
        with torch.random.fork_rng(devices=[fabric.device] if fabric.device.type == "cuda" else []):
            prepare_reference(run, resume)  # draws nothing from the run's random streams
    if resume is not None and not resume.weights_only:
        _resume(run, resume, checkpoint_group)
    elif resume is not None and resume.start_step:
        _continue_at(run, resume.start_step)
    layout = " x ".join(f"{name} {size}" for name, size in dims.sizes().items() if size > 1) or "one process"
    monitor.info(f"nxd-train: {logging.name}: {plan.family.parameter_count():,} parameters, {fabric.world_size} "
                 f"process(es) ({layout}), {plan.objective.name}, global batch {b.global_batch_size} "
                 f"({sampler.accumulation} x {b.micro_batch_size} per rank), {steps} steps of "
                 f"{sampler.steps_per_epoch} per epoch, {plan.data.tokenizer}; logs in {log_dir}")  # fmt: skip
    for line in (*plan.data.notes, *([host_memory] if host_memory else [])):
        monitor.info(line)
    monitor.info(f"MFU: model FLOPs (attention counted in full, not causal) against {ceiling.source}, per device; "
                 f"fp32 matmul precision {torch.get_float32_matmul_precision()}")  # fmt: skip
    if lora is not None:
        _report_adapters(lora, model, plan, monitor)
    if (job := launch.job) is not None and job.restart:
        where = (f"resumed at step {run.start_step} from {resume.path}" if continued
                 else "no complete checkpoint to resume from, so training starts at step 0")  # fmt: skip
        monitor.info(f"{job.says()}: {where}")
    return run


def _group(mesh: DeviceMesh | None) -> torch.distributed.ProcessGroup | None:
    return None if mesh is None else mesh.get_group()


def _write_all(writers: list[Callable[[Path], None]], folder: Path) -> None:
    """Every writer's files into a checkpoint folder."""
    for write in writers:
        write(folder)


def _report_adapters(lora: LoraFamily, model: nn.Module | StagedModel, plan: RunPlan, monitor: Monitor) -> None:
    """The trainable share of the model; with lora_verbose, every adapted layer."""
    s = lora.spec
    monitor.info(f"LoRA r={s.rank} alpha={s.alpha:g} on {len(lora.modules)} layers: {lora.trainable_count():,} adapter "
                 f"parameters ({lora.trainable_count() / plan.family.parameter_count():.2%} of the base model)")
    if plan.adapters.verbose:
        for name in lora.modules:
            monitor.info(f"  LoRA {name}")
        trained = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
        monitor.info(f"  trainable on this rank: {len(trained)} tensors, "
                     f"{sum(p.numel() for p in model.parameters() if p.requires_grad):,} values")


def _took(started: float, plan: RunPlan) -> str:
    return f" in {time.perf_counter() - started:.2f} s" if plan.checkpoints.time_loads else ""


def _load_weights(plan: RunPlan, model: nn.Module | StagedModel, resume: Resume,
                  group: torch.distributed.ProcessGroup | None, monitor: Monitor) -> None:  # fmt: skip
    """The initial weights from an nxd checkpoint or a Hugging Face directory (weight_init_only)."""
    started = time.perf_counter()
    lora = plan.lora
    if lora is not None and plan.adapters.from_checkpoint:
        _load_base(plan, lora, model, resume.path, group)
        load_adapters(model, resume.path, lora, group)
    else:
        load_weights(model, resume, plan.family, group, lora)
    monitor.info(f"initial weights from {resume.path}{_took(started, plan)}")


def _lengths(plan: RunPlan) -> bytes:
    """The training rows' token counts, for length grouping (fine-tuning records only, as the config checks)."""
    return plan.data.train.row_lengths.tobytes()


def _load_base(plan: RunPlan, lora: LoraFamily, model: nn.Module | StagedModel, checkpoint: Path,
               group: torch.distributed.ProcessGroup | None) -> None:  # fmt: skip
    """The base weights under the adapters of LoRA checkpoint `checkpoint`, when it does not hold them
    unmerged: from the plan's base source; none is needed when the run that saved it started from
    the seeded initialisation (which this run repeats)."""
    if holds_frozen_base(checkpoint):
        return
    if (source := plan.adapters.base_source) is None:
        saved_config = read_info(checkpoint).extra.get("config", {})
        if saved_config.get("exp_manager", {}).get("resume_from_checkpoint") is None:
            return
        raise CheckpointError(f"{checkpoint}: holds LoRA adapters without their base model (saved without "
                              "save_lora_base); expected the base in exp_manager.resume_from_checkpoint (continuing "
                              "a run) or in model.model_config as a Hugging Face directory (load_lora_from_ckpt)")
    load_weights(model, source, plan.family, group, lora)


def _continue_at(run: Run, step: int) -> None:
    """Continue from weights alone at `step` (a GPT-NeoX checkpoint's iteration, as NeoX continues): the
    schedule at that step, the data after step x global batch samples, a fresh optimizer."""
    if step >= run.steps:
        raise CheckpointError(f"the checkpoint's iteration is {step}; this run trains {run.steps} steps, so nothing "
                              "is left to train (raise trainer.max_steps, or start from its weights alone with "
                              "model.weight_init_only)")  # fmt: skip
    run.start_step = step
    run.sampler = replace(run.sampler, consumed_samples=step * run.plan.batches.global_batch_size)
    if run.plan.checkpoints.resume_optimizer:  # else the schedule starts from its start, as the optimizer does
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # stepping the schedule before any optimizer step
            for _ in range(step):
                run.scheduler.step()
    run.monitor.info(f"continuing at step {step} from the weights alone: the optimizer state, the data position "
                     "and the random states of the GPT-NeoX checkpoint are not read (a fresh optimizer, samples "
                     "from step x global batch on)")  # fmt: skip


def _resume(run: Run, resume: Resume, group: torch.distributed.ProcessGroup | None) -> None:
    """Continue from a checkpoint: weights, optimizer, schedule, step, data position and, at the same
    world size, every rank's RNG states (a LoRA run's base first, when the checkpoint holds adapters only)."""
    started, monitor, rank = time.perf_counter(), run.monitor, run.fabric.global_rank
    if run.plan.lora is not None:
        _load_base(run.plan, run.plan.lora, run.model, resume.path, group)
    progress, sampler_state = {"step": 0, "consumed_samples": 0}, run.sampler.state_dict()
    checkpoints = run.plan.checkpoints
    same_world = resume.world_size == run.fabric.world_size
    rng = {f"rank{rank}": None} if same_world and checkpoints.resume_rng else {}
    run.training.load(resume.path, progress=progress, sampler=sampler_state, rng=rng, process_group=group,
                      optimizer=checkpoints.resume_optimizer)  # fmt: skip
    if checkpoints.resume_optimizer:  # this config's hyperparameters from the first resumed step
        update = run.plan.update
        apply_options(run.optimizer.optimizer, update.optimizer, update.options)
        apply_schedule(run.scheduler, update.lr)
    try:
        run.sampler = run.sampler.resumed(sampler_state)
    except ValueError as error:
        hint = ""
        if sampler_state["total_samples"] != run.sampler.total_samples and run.sampler.shuffle:
            hint = ("; the run's samples are trainer.max_steps x data.global_batch_size, which changed, and "
                    "data.dataloader_type: cyclic shuffles them all at once: extend with dataloader_type: single, "
                    "or start from this checkpoint's weights (model.weight_init_only: True)")  # fmt: skip
        raise CheckpointError(f"{resume.path}: {error}{hint}") from None
    run.start_step, run.saved_rng = progress["step"], rng.get(f"rank{rank}")
    run.resumed_metrics = dict(read_info(resume.path).metrics)
    if not checkpoints.resume_optimizer:
        monitor.info("a fresh optimizer and the learning-rate schedule from its start (resume_optimizer: False)")
    if not checkpoints.resume_rng:
        monitor.info("random states as seeded, not the checkpoint's (resume_rng: False)")
    elif run.saved_rng is None:
        monitor.info(f"resuming on {run.fabric.world_size} processes from a checkpoint of {resume.world_size}: "
                     "random states start fresh (dropout masks differ from an uninterrupted run)")  # fmt: skip
    monitor.info(f"resumed from {resume.path} at step {run.start_step} ({progress['consumed_samples']} samples)"
                 f"{_took(started, run.plan)}")  # fmt: skip

