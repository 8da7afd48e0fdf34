"""Everything about a run that can be checked before any process is spawned.

`plan_run` turns the config into the plain arguments the packages take (a model description, the
datasets, the Fabric precision) and collects every problem into one `PreflightError`, so a user sees
the full list at once and no worker starts on a run that cannot finish.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from nxd_ckpt import CheckpointError, CheckpointWarning
from nxd_config import ConfigNotice, NxdConfig, Status
from nxd_data import DataError
from nxd_models import AttentionKernel, GPTConfig, HFOverrides, ModelConfigError, load_hf_config
from nxd_precision import (
    PrecisionConfigError,
    PrecisionPolicy,
    bf16_support_problem,
    neuron_runtime_env,
    resolve_policy,
)
from transformers import PretrainedConfig

from .checkpointing import Resume, checkpoint_problems, resume_choice
from .data import DataSplits, build_datasets, unavailable_data_keys
from .logdir import resumable_log_dir
from .parallelism import FP32_POLICY, Layout, plan_problems

REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class PreflightError(Exception):
    """Problems found before launch, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("cannot train this config:\n" + "\n".join(f"  {problem}" for problem in problems))


@dataclass(frozen=True)
class RunPlan:
    model: GPTConfig | PretrainedConfig
    attention: AttentionKernel
    data: DataSplits
    seq_length: int
    layout: Layout = Layout()
    """How the model is split and recomputed."""
    policy: PrecisionPolicy = FP32_POLICY
    """The dtypes of parameters, compute, master weights, gradients and optimizer state."""
    resume: Resume | None = None
    """The checkpoint (or weights) the run starts from."""
    log_dir: Path | None = None
    """An existing log directory the run continues in (resume_if_exists); None makes a new one."""

    @property
    def precision(self) -> str:
        """Fabric's precision plugin: its autocast for the autocast type; nxd holds every other dtype itself."""
        return "bf16-mixed" if self.policy.autocast else "32-true"


def _not_in_this_release(cfg: NxdConfig) -> list[str]:
    found = []
    if cfg.model_alignment_strategy is not None:
        found.append("model_alignment_strategy: fine-tuning methods are not in this release (nxd-align adds them); "
                     "remove the section to pretrain")
    return found + unavailable_data_keys(cfg.data)


def _optimizer_problems(cfg: NxdConfig, accelerator: str) -> list[str]:
    optim = cfg.model.optim
    found = []
    if getattr(optim, "capturable", False) and accelerator != "cuda":
        found.append(f"model.optim.capturable: expected False on {accelerator} (torch's capturable step "
                     "needs CUDA tensors), found True")
    if optim.name == "adafactor" and optim.relative_step and optim.sched is not None:
        found.append("model.optim.sched: adafactor with relative_step computes its own learning rate; "
                     f"expected no sched, found {optim.sched.name}")
    return found


def _megatron_model(cfg: NxdConfig, vocab_size: int, seq_length: int) -> GPTConfig:
    m = cfg.model
    return GPTConfig(
        vocab_size=vocab_size, num_layers=m.num_layers, hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads, seq_length=seq_length, ffn_hidden_size=m.ffn_hidden_size,
        num_kv_heads=m.num_kv_heads, kv_channels=m.kv_channels, max_position_embeddings=m.max_position_embeddings,
        init_method_std=m.init_method_std, use_scaled_init_method=m.use_scaled_init_method,
        hidden_dropout=m.hidden_dropout, attention_dropout=m.attention_dropout, ffn_dropout=m.ffn_dropout,
        apply_query_key_layer_scaling=m.apply_query_key_layer_scaling, normalization=m.normalization,
        layernorm_epsilon=m.layernorm_epsilon, transformer_block_type=m.transformer_block_type,
        make_vocab_size_divisible_by=m.make_vocab_size_divisible_by,
        tensor_parallel_size=cfg.distributed_strategy.tensor_model_parallel_size,
        share_embeddings_and_output_weights=m.share_embeddings_and_output_weights,
        position_embedding_type=m.position_embedding_type, rotary_percentage=m.rotary_percentage,
        rope_theta=m.rope_theta or 10000.0, activation=m.activation, has_bias=m.has_bias, qkv_linear=m.qkv_linear,
        fuse_qkv=m.fuse_qkv,
    )  # fmt: skip


def _hf_model(cfg: NxdConfig, vocab_size: int, seq_length: int) -> PretrainedConfig:
    m = cfg.model
    overrides = HFOverrides(m.num_layers, m.hidden_size, m.max_position_embeddings, m.rope_theta)
    config = load_hf_config(m.hf_model_config, overrides)
    problems = []
    if m.qkv_linear:
        problems.append("model.qkv_linear: applies to megatron models (a Hugging Face model keeps transformers' "
                        "q/k/v projections); expected False")
    if config.vocab_size < vocab_size:
        problems.append(f"{m.hf_model_config}: vocab_size: expected at least the tokenizer's {vocab_size} tokens, "
                        f"found {config.vocab_size}")
    if seq_length > config.max_position_embeddings:
        problems.append(f"data.seq_length: expected at most max_position_embeddings ({config.max_position_embeddings}) "
                        f"of {m.hf_model_config}, found {seq_length}")
    if problems:
        raise ModelConfigError(*problems)
    return config


def accelerator_name() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def precision_policy(cfg: NxdConfig) -> PrecisionPolicy:
    """The policy `precision` describes (the manual knobs are read for type manual only)."""
    p = cfg.precision
    return resolve_policy(
        p.type, master_weights=p.master_weights, fp32_grad_acc=p.fp32_grad_acc, fp32_grads_cc=p.fp32_grads_cc,
        xla_use_bf16=p.xla_use_bf16 == "1", xla_downcast_bf16=p.xla_downcast_bf16 == "1",
        stochastic_rounding=p.neuron_rt_stochastic_rounding_en == "1",
        parallel_layers_reduce_dtype=REDUCE_DTYPES.get(p.parallel_layers_reduce_dtype),
        fp32_optimizer_state=cfg.model.optim.name == "adamw_fp32OptState",
    )  # fmt: skip


def neuron_environment(cfg: NxdConfig, current: Mapping[str, str]) -> dict[str, str]:
    """The AWS Neuron runtime variables the config asks for (set only when the device is a Neuron one)."""
    p = cfg.precision
    return neuron_runtime_env(
        current, precision_type=p.type, manual_knobs=(p.xla_use_bf16, p.xla_downcast_bf16,
                                                      p.neuron_rt_stochastic_rounding_en),
        compiler_flags=cfg.compiler_flags, compiler_cache_url=cfg.compiler_cache_url,
        async_exec_max_inflight_requests=cfg.aync_exec_max_inflight_requests,
        bucket_size_collectives=cfg.bucket_size_collectives, neuron_rt_exec_timeout=cfg.neuron_rt_exec_timeout,
        neuron_experimental_compress_rg=cfg.neuron_experimental_compress_rg, lnc=cfg.trainer.lnc,
        fuse_softmax=cfg.model.fusions.softmax,
    )  # fmt: skip


def _resume(cfg: NxdConfig) -> tuple[Resume | None, Path | None]:
    """The checkpoint the resume keys select and the log directory a resumed run continues in, with
    notices for checkpoints passed over and resume keys that change nothing here."""
    exp = cfg.exp_manager
    search = resumable_log_dir(exp, cfg.name) if exp.resume_if_exists else None
    with warnings.catch_warnings(record=True) as skipped:
        warnings.simplefilter("always", CheckpointWarning)
        try:
            resume = resume_choice(cfg, search)
        except CheckpointError as error:
            raise PreflightError([str(error)]) from None
    for warning in skipped:
        warnings.warn(str(warning.message), ConfigNotice, stacklevel=3)
    if resume is None and exp.resume_if_exists:
        warnings.warn(f"exp_manager.resume_if_exists: no complete checkpoint under {search}; starting a new run "
                      "(resume_ignore_no_checkpoint)", ConfigNotice, stacklevel=3)  # fmt: skip
    if cfg.model.weight_init_only and resume is None:
        warnings.warn("model.weight_init_only: no checkpoint is loaded, so it changes nothing", ConfigNotice,
                      stacklevel=3)  # fmt: skip
    continues = resume is not None and exp.resume_if_exists and not exp.resume_from_checkpoint
    return resume, search if continues else None


def plan_run(cfg: NxdConfig, cache_dir: Path) -> RunPlan:
    """The checked plan of a run, or a PreflightError listing every problem."""
    problems = _not_in_this_release(cfg) + _optimizer_problems(cfg, accelerator_name()) + checkpoint_problems(cfg)
    try:
        policy = precision_policy(cfg)
    except PrecisionConfigError as error:
        problems.append(str(error))
    else:
        if problem := bf16_support_problem(policy, torch.device(accelerator_name())):
            problems.append(problem)
    if problems:
        raise PreflightError(problems)
    resume, log_dir = _resume(cfg)
    params = cfg.exp_manager.checkpoint_callback_params
    if cfg.exp_manager.create_checkpoint_callback and not (params.save_top_k or params.save_last):
        warnings.warn("exp_manager.checkpoint_callback_params.save_top_k: 0 keeps no checkpoint and save_last is "
                      "False, so this run writes none", ConfigNotice, stacklevel=2)  # fmt: skip
    if params.use_master_weights_in_ckpt and policy.master_dtype is None:
        warnings.warn(f"exp_manager.checkpoint_callback_params.use_master_weights_in_ckpt: precision "
                      f"{cfg.precision.type} keeps no master weights; checkpoints hold the model weights",
                      ConfigNotice, stacklevel=2)  # fmt: skip
    if neuron_keys := cfg.set_keys_with_status(Status.NEURON_ONLY):
        warnings.warn(f"acted on only on AWS Neuron devices: {', '.join(neuron_keys)}", ConfigNotice, stacklevel=2)
    ds = cfg.distributed_strategy
    if ds.tensor_model_parallel_size == 1:
        for key, value, default in (("sequence_parallel", ds.sequence_parallel, False),
                                    ("kv_replicator", ds.kv_replicator, 1)):  # fmt: skip
            if value != default:
                warnings.warn(f"distributed_strategy.{key}: {value} acts across tensor-parallel ranks; with "
                              "tensor_model_parallel_size 1 it changes nothing", ConfigNotice, stacklevel=2)
    if ds.context_parallel_size == 1 and cfg.model.fusions.ring_attention:
        warnings.warn("model.fusions.ring_attention: True acts across context-parallel ranks; with "
                      "context_parallel_size 1 attention runs unsplit", ConfigNotice, stacklevel=2)
    seq_length = cfg.seq_length
    train_samples = cfg.trainer.max_steps * cfg.global_batch_size if cfg.trainer.max_steps > 0 else None
    try:
        data = build_datasets(cfg.data, seq_length, cache_dir, train_samples=train_samples, seed=cfg.seed)
    except DataError as error:
        raise PreflightError([str(error)]) from None
    if len(data.train) < cfg.global_batch_size:
        raise PreflightError([f"data.global_batch_size: expected at most the {len(data.train)} samples of the "
                              f"training split, found {cfg.global_batch_size}"])
    try:
        if cfg.model_source == "hf":
            model = _hf_model(cfg, data.vocab_size, seq_length)
        else:
            model = _megatron_model(cfg, data.vocab_size, seq_length)
    except ModelConfigError as error:
        raise PreflightError(error.problems) from None
    fusions = cfg.model.fusions
    attention = AttentionKernel.from_fusions(fusions.flash_attention, fusions.softmax)
    ds = cfg.distributed_strategy
    layout = Layout.from_config(cfg, policy)
    if problems := plan_problems(model, attention, layout, ds.tensor_model_parallel_size,
                                 ds.pipeline_model_parallel_size, ds.context_parallel_size):  # fmt: skip
        raise PreflightError(problems)
    return RunPlan(model, attention, data, seq_length, layout, policy, resume, log_dir)
