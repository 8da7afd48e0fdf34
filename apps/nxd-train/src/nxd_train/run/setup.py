"""A run set up from its plan, in one pass from top to bottom: the launcher's world (Lightning Fabric:
processes, accelerator, seeding), the device mesh, the log directory, the data order and monitor, the
sharded model with its initial weights and how a step executes on it, the optimizer and LR schedule,
the checkpointer, and the state it continues from (`restore`).
"""

from __future__ import annotations

import logging as logging_module
import os
import warnings
from dataclasses import replace
from datetime import timedelta
from functools import partial

import torch
import yaml
from lightning_fabric import Fabric
from lightning_fabric.plugins.environments import LightningEnvironment
from nxd_align import LoraFamily
from nxd_ckpt import read_info
from nxd_data import PretrainingSampler, save_atomically
from nxd_models import device_ceiling
from nxd_parallel import StagedModel, build_executor, keep_freed_host_memory
from nxd_precision import LossScaler, PrecisionOptimizer, build_optimizer, build_scheduler
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from nxd_train.cluster.environment import LaunchedEnvironment, RoundStrategy
from nxd_train.cluster.peers import PeerWatch
from nxd_train.cluster.peers import current as current_watch
from nxd_train.logging.log_dir import hold_on_rank_0
from nxd_train.logging.monitor import RANK_LOGS, Monitor, rank_log_name
from nxd_train.run.checkpointing import Resume
from nxd_train.run.initial_weights import initial_model
from nxd_train.run.plan import RunPlan
from nxd_train.run.profiling import StepProfiler
from nxd_train.run.restore import restore
from nxd_train.run.rollouts import Rollouts
from nxd_train.run.saving import set_up_saving
from nxd_train.run.state import Run, forward_autocast
from nxd_train.run.statistics import StepStatistics
from nxd_train.run.training_state import TrainingState

NEURON_DEVICE_TYPES = ("neuron", "xla")
"""Device types of AWS Neuron cores, whose runtime reads the plan's Neuron variables."""


class _NoMatmulPrecisionNotice(logging_module.Filter):
    """Drops Lightning's advice to set the fp32 matmul precision: precision.fp32_matmul_precision sets it."""

    def filter(self, record: logging_module.LogRecord) -> bool:
        return "set_float32_matmul_precision" not in record.getMessage()


def setup(plan: RunPlan) -> Run:
    """Launch the processes and build everything the loop needs, resumed where the plan says. It reads in
    the order a run stands up: the launcher's world, the device mesh, the log directory, the data order,
    the monitor, the model with its initial weights, the update, the checkpointer, the state it continues from."""
    fabric = launch_processes(plan)
    dims = replace(plan.launch.parallel, world_size=fabric.world_size)  # the launched world (checked: the same)
    mesh = dims.build_mesh(fabric.device.type)
    logging, launch, rank = plan.logging, plan.launch, fabric.global_rank
    log_dir, lock = hold_on_rank_0(
        fabric,
        logging.explicit_log_dir,
        logging.exp_dir,
        logging.exp_name,
        plan.log_dir,
        written=(logging.json_log_file,) if logging.json_log_file else (),
        launch_tag=None if launch.job is None else launch.job.tag,
    )
    if (watch := current_watch()) is not None:  # a silent peer's stop writes this rank's stacks beside its log
        watch.stacks_file = log_dir / rank_log_name(rank, fabric.local_rank)
        watch.stacks_pattern = str(log_dir / RANK_LOGS)
    try:
        host_memory = None
        if launch.keep_freed_host_memory and fabric.device.type == "cpu":
            host_memory = keep_freed_host_memory()
        resume = fabric.broadcast(plan.resume, src=0)  # rank 0's choice, should a checkpoint appear meanwhile
        if rank == 0:
            save_atomically(log_dir / "config.yaml", yaml.safe_dump(plan.resolved_config, sort_keys=False).encode())
        b = plan.batches
        sampler = PretrainingSampler(  # the order of the training samples over the data-parallel ranks
            len(plan.data.train),
            b.global_batch_size,
            b.micro_batch_size,
            dims.dp,
            mesh.data_parallel_rank,
            seed=launch.seed,
            shuffle=b.reshuffle_each_epoch or not plan.data.shuffled,
            reshuffle_each_epoch=b.reshuffle_each_epoch,
            lengths=plan.data.train.row_lengths.tobytes() if b.group_by_length else None,  # fine-tuning records
        )
        steps = plan.cadence.total_steps(sampler.steps_per_epoch * plan.repeats)
        continues_here = resume is not None and not resume.weights_only and plan.log_dir is not None
        monitor = Monitor(  # a continued run keeps the rows its checkpoint covers
            log_dir,
            global_rank=rank,
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
        group = None  # checkpoints' own gloo group: saves and loads never queue behind the training collectives
        if (plan.checkpoints.enabled or resume is not None) and torch.distributed.is_initialized():
            group = torch.distributed.new_group(backend="gloo", timeout=timedelta(seconds=launch.collective_timeout))
        model = initial_model(plan, fabric, mesh, resume, group, monitor, sampler.accumulation)
        executor = build_executor(
            model,
            plan.family.token_losses,
            fabric.device,
            pp=mesh.get("pp"),
            microbatches=sampler.accumulation,
            autocast=forward_autocast(fabric, plan.policy),
        )
        update, family = plan.update, plan.family
        trained = [name for name, p in model.named_parameters() if p.requires_grad]
        optimizer = PrecisionOptimizer(
            model.parameters(),
            plan.policy,
            partial(
                build_optimizer,
                update.optimizer,
                options=update.options,
                decay_norms_and_biases=update.decay_norms_and_biases,
                scales=family.optimizer_scales(trained, update.optimizer),  # muP's, where the model has them
                fp32_state=family.fp32_state_parameters(trained),
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
            lora=plan.lora,
            lora_base=None if plan.adapters is None else plan.adapters.base,
            scaler=scaler,
        )
        saving = set_up_saving(plan, fabric, dims, log_dir, steps, resume, group, monitor)
        ceiling = device_ceiling(fabric.device, plan.policy.compute_dtype)
        ceiling.flops = fabric.all_reduce(torch.tensor(ceiling.flops, device=fabric.device), reduce_op="sum").item()
        statistics = logging.statistics
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
            saving.checkpointer,
            saving.record,
            steps,
            flops_per_token=family.flops_per_token(plan.seq_length),
            ceiling=ceiling,
            objective=plan.objective.split_over(_group(mesh.get("cp"))),
            train_data=plan.data.train,
            validation_data=plan.data.validation,
            test_data=plan.data.test,
            padding=plan.data.padding,
            attach=saving.attach,
            checkpoint_group=group,
            scaler=scaler,
            trainer_outputs=saving.trainer_outputs,
            uploads=saving.uploads,
            profiler=None
            if logging.profiler is None
            else StepProfiler(logging.profiler, log_dir, fabric.device, rank, monitor.info),
            statistics=StepStatistics(statistics, training.names, b.global_batch_size, _group(mesh.get("pp")))
            if statistics.any
            else None,
            log_dir_lock=lock,
        )
        if plan.online is not None:  # sample, score and lay out each step's prompts before the policy's pass
            online = plan.online
            run.rollouts = Rollouts(
                run, online.grpo, online.rewards, plan.data.text_tokenizer, online.initial, online.reward_models
            )
            run.step_passes.append(run.rollouts)
        restore(run, resume)
        _announce(run, resume, host_memory)
    except BaseException:
        lock.release()
        raise
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


def _announce(run: Run, resume: Resume | None, host_memory: str | None) -> None:
    """The run's start lines: what trains on what, its data, the MFU ceiling, adapters, a restart's round."""
    plan, monitor, fabric, b = run.plan, run.monitor, run.fabric, run.plan.batches
    layout = " x ".join(f"{name} {size}" for name, size in run.dims.sizes().items() if size > 1) or "one process"
    monitor.info(
        f"nxd-train: {plan.logging.name}: {plan.family.parameter_count():,} parameters, {fabric.world_size} "
        f"process(es) ({layout}), {plan.objective.name}, global batch {b.global_batch_size} "
        f"({run.sampler.accumulation} x {b.micro_batch_size} per rank), {run.steps} steps of "
        f"{run.steps_per_epoch} per epoch, {plan.data.tokenizer}; logs in {run.log_dir}"
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
