"""The loop's settings from the config, as plain values (`RunPlan`'s cadence, launch, batches, update, logging
and checkpoints), and the precision policy and layout the config asks for."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import torch
from nxd_ckpt import S3Target
from nxd_config import NxdConfig
from nxd_data import SequenceCurriculum
from nxd_parallel import LaunchWorld, Layout, ParallelDims
from nxd_precision import Float8Spec, LossScaling, PrecisionPolicy, neuron_runtime_env, resolve_policy

from nxd_train.cluster.interrupts import Preemption
from nxd_train.cluster.job import Job
from nxd_train.logging.log_dir import optional_path
from nxd_train.logging.settings import CometSettings, WandbSettings
from nxd_train.run.checkpointing import save_policy
from nxd_train.run.plan import Batches, Cadence, Checkpoints, EarlyStopping, Launch, Logging, Update
from nxd_train.run.profiling import ProfilerWindow
from nxd_train.run.statistics import StatisticsSettings

REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def precision_policy(cfg: NxdConfig) -> PrecisionPolicy:
    """The policy `precision` describes (the manual knobs are read for type manual only)."""
    p = cfg.precision
    return resolve_policy(
        p.type,
        master_weights=p.master_weights,
        fp32_grad_acc=p.fp32_grad_acc,
        fp32_grads_cc=p.fp32_grads_cc,
        xla_use_bf16=p.xla_use_bf16 == "1",
        xla_downcast_bf16=p.xla_downcast_bf16 == "1",
        stochastic_rounding=p.neuron_rt_stochastic_rounding_en == "1",
        parallel_layers_reduce_dtype=REDUCE_DTYPES.get(p.parallel_layers_reduce_dtype),
        fp32_optimizer_state=cfg.model.optim.name == "adamw_fp32OptState",
        float8=None
        if p.fp8 is None
        else Float8Spec(
            recipe=p.fp8.recipe,
            format=p.fp8.format,
            weight_gradient=p.fp8.weight_gradient,
            emulate=p.fp8.emulate,
            all_gather=p.fp8.all_gather,
        ),
    )


def loss_scaling(cfg: NxdConfig, policy: PrecisionPolicy) -> LossScaling | None:
    """The loss scaling of `policy`'s fp16 from the `precision` keys (None without fp16)."""
    p = cfg.precision
    if not policy.needs_loss_scaling:
        return None
    return LossScaling(
        loss_scale=p.loss_scale,
        initial_scale_power=p.initial_scale_power,
        loss_scale_window=p.loss_scale_window,
        hysteresis=p.hysteresis,
        min_loss_scale=p.min_loss_scale,
        consecutive_hysteresis=p.consecutive_hysteresis,
    )


def neuron_environment(cfg: NxdConfig, current: Mapping[str, str]) -> dict[str, str]:
    """The AWS Neuron runtime variables the config asks for (set only when the device is a Neuron one)."""
    p = cfg.precision
    return neuron_runtime_env(
        current,
        precision_type=p.type,
        manual_knobs=(p.xla_use_bf16, p.xla_downcast_bf16, p.neuron_rt_stochastic_rounding_en),
        compiler_flags=cfg.compiler_flags,
        compiler_cache_url=cfg.compiler_cache_url,
        async_exec_max_inflight_requests=cfg.aync_exec_max_inflight_requests,
        bucket_size_collectives=cfg.bucket_size_collectives,
        neuron_rt_exec_timeout=cfg.neuron_rt_exec_timeout,
        neuron_experimental_compress_rg=cfg.neuron_experimental_compress_rg,
        lnc=cfg.trainer.lnc,
        fuse_softmax=cfg.model.fusions.softmax,
    )


def layout_of(cfg: NxdConfig, policy: PrecisionPolicy) -> Layout:
    """The layout the config asks for; tensor-parallel reductions follow the precision policy (a
    reduction in the activations' own dtype needs no cast)."""
    ds, m, reduce = cfg.distributed_strategy, cfg.model, policy.parallel_layers_reduce_dtype
    return Layout(
        sequence_parallel=ds.sequence_parallel and ds.tensor_model_parallel_size > 1,
        zero1=ds.zero1,
        zero3=ds.zero3,
        cpu_offload=ds.cpu_offload,
        kv_replicator=ds.kv_replicator,
        recompute=m.activations_checkpoint_granularity,
        recompute_modules=tuple(m.activations_checkpoint_recompute or ()),
        recompute_mlp=m.activations_checkpoint_recompute_mlp,
        reduce_dtype=None if reduce == policy.compute_dtype else reduce,
        grad_reduce_dtype=policy.grad_reduction_dtype,
        ranks_at_once=cfg.trainer.sequential_move_factor,
        virtual_stages=ds.virtual_pipeline_model_parallel_size or 1,
        pipeline_cuts=None if m.pipeline_cuts is None else tuple(m.pipeline_cuts),
        compile_blocks=m.fusions.torch_compile,
    )


def _wandb(cfg: NxdConfig) -> WandbSettings | None:
    exp = cfg.exp_manager
    if not exp.create_wandb_logger:
        return None
    w = exp.wandb_logger_kwargs
    return WandbSettings(
        project=w.project, name=w.name or exp.name or cfg.name, group=w.group, entity=w.entity, host=w.host
    )


def _s3(cfg: NxdConfig) -> S3Target | None:
    s3 = cfg.exp_manager.s3_checkpoints
    return None if s3.path is None else S3Target(s3.path, s3.chunk_size)


def _comet(cfg: NxdConfig) -> CometSettings | None:
    exp = cfg.exp_manager
    if not exp.create_comet_logger:
        return None
    c = exp.comet_logger_kwargs
    return CometSettings(
        workspace=c.workspace, project=c.project, name=c.name or exp.name or cfg.name, tags=c.tags, others=c.others
    )


def _profiler(cfg: NxdConfig) -> ProfilerWindow | None:
    p = cfg.exp_manager.profiler
    if not (p.enabled or p.memory):
        return None
    return ProfilerWindow(
        start_step=p.start_step,
        stop_step=p.stop_step,
        trace=p.enabled,
        memory=p.memory,
        memory_dir=optional_path(p.memory_dir),
    )


def _curriculum(cfg: NxdConfig) -> SequenceCurriculum | None:
    c = cfg.data.curriculum
    if not c.enabled:
        return None
    return SequenceCurriculum(
        min_length=c.min_length,
        max_length=c.max_length or cfg.seq_length,
        schedule=c.schedule,
        total_steps=c.total_steps,
        length_step=c.length_step,
        root_degree=c.root_degree,
        lengths=c.lengths,
        max_steps=c.max_steps,
    )


def _statistics(cfg: NxdConfig) -> StatisticsSettings:
    exp = cfg.exp_manager
    noise = exp.gradient_noise_scale
    return StatisticsSettings(
        gradient_zeros=exp.log_gradient_zeros,
        optimizer_states=exp.log_optimizer_states,
        noise_scale_batches=noise.n_batches if noise.enabled else None,
        noise_scale_offload=noise.cpu_offload,
    )


def loop_settings(
    cfg: NxdConfig,
    policy: PrecisionPolicy,
    decode: Callable[[list[int]], str] | None,
    world: LaunchWorld | None = None,
    job: Job | None = None,
    capturable: bool = True,
) -> dict:
    """The loop's settings: cadence, launch, batches, update, logging and checkpoints; `decode` counts the
    characters of evaluated samples (trainer.char_level_ppl); without `capturable` the optimizer's capturable step
    is off whatever model.optim says (it needs the optimizer's tensors on CUDA)."""
    t, exp, d, optim = cfg.trainer, cfg.exp_manager, cfg.data, cfg.model.optim
    ds = cfg.distributed_strategy
    options = {name: getattr(optim, name) for name in type(optim).model_fields if name not in ("name", "sched")}
    if not capturable:
        options["capturable"] = False
    sched = optim.sched
    return dict(
        preemption=Preemption(t.requeue_signal, t.auto_requeue, t.requeue_exit_code),
        cadence=Cadence(
            max_steps=t.max_steps,
            max_epochs=t.max_epochs,
            log_every_n_steps=t.log_every_n_steps,
            val_check_interval=t.val_check_interval,
            check_val_every_n_epoch=t.check_val_every_n_epoch,
            num_sanity_val_steps=t.num_sanity_val_steps,
            limit_val_batches=t.limit_val_batches,
            limit_test_batches=t.limit_test_batches,
            early_stopping=_early_stopping(cfg),
            exit_interval=t.exit_interval,
            decode=decode,
        ),
        launch=Launch(
            devices=t.devices,
            num_nodes=t.num_nodes,
            parallel=ParallelDims(
                t.devices * t.num_nodes,
                tp=ds.tensor_model_parallel_size,
                pp=ds.pipeline_model_parallel_size,
                cp=ds.context_parallel_size,
                ep=ds.expert_model_parallel_size,
            ),
            seed=cfg.seed,
            use_cpu_initialization=cfg.model.use_cpu_initialization,
            neuron_environment=neuron_environment(cfg, os.environ),
            fp32_matmul_precision=cfg.precision.fp32_matmul_precision,
            keep_freed_host_memory=t.keep_freed_host_memory,
            collective_timeout=ds.collective_timeout,
            world=world,
            job=job,
        ),
        batches=Batches(
            global_batch_size=cfg.global_batch_size,
            micro_batch_size=d.micro_batch_size,
            num_workers=d.num_workers,
            reshuffle_each_epoch=d.dataloader_type == "cyclic",
            validation_drop_last=d.validation_drop_last,
            pad_to_global_batch=d.pad_samples_to_global_batch_size,
            group_by_length=d.group_by_length,
            curriculum=_curriculum(cfg),
        ),
        update=Update(
            optimizer=optim.name,
            options=options,
            decay_norms_and_biases=cfg.model.do_layer_norm_weight_decay,
            schedule=None if sched is None else sched.name,
            schedule_options={} if sched is None else sched.model_dump(exclude={"name"}),
            clip=t.gradient_clip_val,
            on_nonfinite=t.on_nonfinite,
            max_consecutive_nonfinite=t.max_consecutive_nonfinite,
            loss_scaling=loss_scaling(cfg, policy),
        ),
        logging=Logging(
            name=cfg.name,
            exp_name=exp.name or cfg.name,
            explicit_log_dir=optional_path(exp.explicit_log_dir),
            exp_dir=optional_path(exp.exp_dir),
            gradient_norm=exp.log_gradient_norm,
            parameter_norm=exp.log_parameter_norm,
            step_timing=exp.log_step_timing,
            local_rank_0_only=exp.log_local_rank_0_only,
            tensorboard=exp.create_tensorboard_logger,
            wandb=_wandb(cfg),
            comet=_comet(cfg),
            json_log_file=exp.json_log_file,
            trainer_checkpoints=exp.trainer_checkpoints,
            profiler=_profiler(cfg),
            statistics=_statistics(cfg),
        ),
        checkpoints=Checkpoints(
            enabled=exp.create_checkpoint_callback,
            policy=save_policy(cfg),
            asynchronous=exp.async_checkpointing,
            use_master_weights=exp.checkpoint_callback_params.use_master_weights_in_ckpt,
            save_bf16=exp.save_bf16,
            time_loads=exp.enable_recovery_time_instrumentation,
            resume_optimizer=exp.resume_optimizer,
            resume_rng=exp.resume_rng,
            s3=_s3(cfg),
        ),
        resolved_config=cfg.model_dump(mode="json", by_alias=True),
    )


def _early_stopping(cfg: NxdConfig) -> EarlyStopping | None:
    exp = cfg.exp_manager
    if not exp.create_early_stopping_callback:
        return None
    params = exp.early_stopping_callback_params
    return EarlyStopping(patience=params.patience, min_delta=params.min_delta)
