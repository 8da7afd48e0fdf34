"""Everything about a run that can be checked before any process is spawned.

`plan_run` turns the config into the plan the loop runs (`plan.RunPlan`: the model family, the
datasets, the layout, the precision policy, the cadence ...) and collects every problem into one
`PreflightError`, so a user sees the full list at once and no worker starts on a run that cannot
finish. This is the only module of a run that reads the config.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import itertools
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from nxd_align import LoraFamily, LoraSpec, Objective, objective_for, reference_digest
from nxd_ckpt import CheckpointError, CheckpointWarning, S3Target, latest_checkpoint, read_info
from nxd_config import ConfigNotice, NxdConfig, Status
from nxd_config.schema.alignment import DPOConfig, KTOConfig, ORPOConfig, RewardModelConfig
from nxd_config.schema.model import MoEConfig, MupConfig, SparseAttentionConfig
from nxd_data import DataError, SequenceCurriculum, save_atomically
from nxd_models import (
    AttentionKernel,
    GMLPSpec,
    GPTConfig,
    HFOverrides,
    MambaSpec,
    ModelConfigError,
    ModelFamily,
    MoESpec,
    MupSpec,
    RWKVSpec,
    SparsitySpec,
    base_shapes_text,
    gpt_base_shapes,
    load_hf_config,
    model_family,
    read_base_shapes,
)
from nxd_parallel import LaunchWorld, Layout
from nxd_precision import (
    FLOAT8_MATMUL_MULTIPLE,
    Float8Spec,
    LossScaling,
    PrecisionConfigError,
    PrecisionPolicy,
    adam8bit_support_problem,
    bf16_support_problem,
    float8_coverage,
    float8_support_problem,
    neuron_runtime_env,
    resolve_policy,
)

from nxd_train.checks.launcher import Job, job_of, launcher_world, restarted
from nxd_train.checks.layout import layout_problems
from nxd_train.checks.resume import IDENTITY, architecture, compare, data_identity
from nxd_train.cluster.interrupts import Preemption
from nxd_train.logging.log_dir import (
    CHECKPOINT_DIR,
    LOCK_FILE,
    changed_keys,
    earlier_config,
    earlier_records,
    log_dir_problems,
    resumable_log_dir,
)
from nxd_train.run.checkpointing import (
    Resume,
    checkpoint_problems,
    head_problem,
    initial_weights_problems,
    is_hf_directory,
    resume_choice,
    save_policy,
)
from nxd_train.run.data import (
    DataSplits,
    ModelVocabulary,
    build_datasets,
    data_left_out,
    run_tokenizer,
    unavailable_data_keys,
)
from nxd_train.run.plan import (
    Adapters,
    Batches,
    Cadence,
    Checkpoints,
    CometSettings,
    EarlyStopping,
    Launch,
    Logging,
    Reference,
    RunPlan,
    Update,
    WandbSettings,
)
from nxd_train.run.profiling import ProfilerWindow
from nxd_train.run.statistics import StatisticsSettings

if TYPE_CHECKING:
    from transformers import PretrainedConfig

REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class PreflightError(Exception):
    """Problems found before launch, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("cannot train this config:\n" + "\n".join(f"  {problem}" for problem in problems))


def _method(cfg: NxdConfig) -> str | None:
    """The fine-tuning method (sft, dpo, orpo, kto, reward_model), or None to pretrain."""
    return None if cfg.model_alignment_strategy is None else cfg.model_alignment_strategy.method


def _not_in_this_release(cfg: NxdConfig) -> list[str]:
    found = []
    if (alignment := cfg.model_alignment_strategy) is not None:
        if alignment.method is None and alignment.peft is None:
            found.append(
                "model_alignment_strategy: expected a method (sft, dpo, orpo, kto, reward_model) or peft, "
                "found an empty section; remove it to pretrain"
            )
        if alignment.reward_model is not None and alignment.peft is not None:
            found.append(
                "model_alignment_strategy.peft: not available with reward_model (the score head trains beside "
                "the adapters, which LoRA checkpoints do not hold yet); expected no peft block"
            )
        if (peft := alignment.peft) is not None and peft.save_lora_base and peft.merge_lora:
            found.append(
                "model_alignment_strategy.peft: save_lora_base and merge_lora both write the base weights "
                "of a checkpoint; expected at most one of them True"
            )
    return found + _compile_problems(cfg) + unavailable_data_keys(cfg.data, fine_tuning=_method(cfg) is not None)


def _compile_problems(cfg: NxdConfig) -> list[str]:
    """The layouts compiled decoder blocks cannot take yet, by name: torch.compile over tensor-parallel
    blocks fails inside DTensor's backward (with recomputation or with a transformers model) or drops
    the embedding's gradient (a transformers model entering sequence parallelism)."""
    tp = cfg.distributed_strategy.tensor_model_parallel_size
    if not cfg.model.fusions.torch_compile or tp == 1:
        return []
    return [
        f"model.fusions.torch_compile: not available with tensor parallelism (distributed_strategy."
        f"tensor_model_parallel_size: {tp}); expected one of them off"
    ]


def _optimizer_problems(cfg: NxdConfig) -> list[str]:
    optim = cfg.model.optim
    found = []
    if optim.name == "adafactor" and optim.relative_step and optim.sched is not None:
        found.append(
            "model.optim.sched: adafactor with relative_step computes its own learning rate; "
            f"expected no sched, found {optim.sched.name}"
        )
    return found


def _megatron_model(
    cfg: NxdConfig, vocab_size: int, seq_length: int, prompt_ids: tuple[int, ...] = (), *, mup: bool = True
) -> GPTConfig:
    """The Megatron-style model of `cfg` (without muP's settings when `mup` is False)."""
    m, prompt = cfg.model, cfg.model.soft_prompt
    config = GPTConfig(
        vocab_size=vocab_size,
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        seq_length=seq_length,
        ffn_hidden_size=m.ffn_hidden_size,
        num_kv_heads=m.num_kv_heads,
        kv_channels=m.kv_channels,
        max_position_embeddings=m.max_position_embeddings,
        init_method_std=m.init_method_std,
        use_scaled_init_method=m.use_scaled_init_method,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        ffn_dropout=m.ffn_dropout,
        apply_query_key_layer_scaling=m.apply_query_key_layer_scaling,
        normalization=m.normalization,
        layernorm_epsilon=m.layernorm_epsilon,
        qk_layernorm=m.qk_layernorm,
        transformer_block_type=m.transformer_block_type,
        make_vocab_size_divisible_by=m.make_vocab_size_divisible_by,
        tensor_parallel_size=cfg.distributed_strategy.tensor_model_parallel_size,
        share_embeddings_and_output_weights=m.share_embeddings_and_output_weights,
        position_embedding_type=m.position_embedding_type,
        position_embedding_offset=m.position_embedding_offset,
        rpe_num_buckets=m.rpe_num_buckets,
        rpe_max_distance=m.rpe_max_distance,
        rotary_percentage=m.rotary_percentage,
        rope_theta=m.rope_theta or 10000.0,
        activation=m.activation,
        has_bias=m.has_bias,
        attention_bias=m.attention_bias,
        mlp_bias=m.mlp_bias,
        init_method=m.init_method,
        output_layer_init_method=m.output_layer_init_method,
        qkv_linear=m.qkv_linear,
        fuse_qkv=m.fuse_qkv,
        sliding_window=m.sliding_window_size,
        loss_chunk_tokens=m.fusions.loss_chunk_tokens,
        moe=moe_spec(m.moe),
        attention_layers=m.attention_layers,
        layer_settings=(
            sparsity_spec(m.sparse_attention, cfg.seed),
            GMLPSpec(m.gmlp_attention_dim),
            MambaSpec(m.mamba_inner_size, m.mamba_conv_bias, m.mamba_linear_bias),
            RWKVSpec(m.rwkv_dim_att, m.rwkv_ffn_size),
        ),
        num_unique_layers=m.num_unique_layers,
        param_sharing_style=m.param_sharing_style,
        soft_prompt_tokens=0 if prompt is None else prompt.n_tokens,
        soft_prompt_init_range=0.5 if prompt is None else prompt.init_range,
        soft_prompt_init_ids=prompt_ids,
        position_embedding_multiplier=m.position_embedding_multiplier,
        position_embedding_norm=m.position_embedding_norm,
    )
    if not mup or m.mup is None:
        return config
    return replace(config, mup=_mup_spec(m.mup, config))


def _float8_spec(family: ModelFamily | LoraFamily, spec: Float8Spec, kv_replicator: int) -> Float8Spec:
    """`spec` with the key/value projections a kv_replicator replicates kept in their precision: each rank computes
    only its head rows of them, outside the float8 layer."""
    if kv_replicator == 1:
        return spec
    return replace(spec, kept=tuple(pattern for pattern, style in family.tp_plan().items() if style == "colwise_kv"))


def _float8_coverage(family: ModelFamily | LoraFamily, spec: Float8Spec, device: torch.device, tp: int) -> list[str]:
    """A model with no decoder layer float8 can take is refused, as is a layer whose tensor-parallel part is not a
    multiple of 16 and, on gloo, a float8 gather of a layer holding float8 weights alone; one where some layers keep
    their precision is noticed."""
    model = family.build_on_meta()
    swapped, kept = float8_coverage(model, spec)
    if tp > 1 and (problem := _float8_split_problem(family, model, swapped, tp)):
        return [problem]
    if spec.all_gather and device.type == "cpu" and (alone := _float8_only_layer(family, model, swapped)):
        return [
            f"precision.fp8.all_gather: gloo, the CPU's collectives, cannot gather float8 tensors, and decoder "
            f"layer {alone} holds no other parameter (FSDP2 gathers a layer of several dtypes as bytes, which "
            f"gloo can); expected a GPU (NCCL) or all_gather false"
        ]
    if not swapped:
        return [
            f"precision.fp8: no linear layer of the decoder layers can compute in float8 (torch._scaled_mm needs "
            f"both sizes multiples of 16; fused QKV modules and stacked experts are not linear layers), found "
            f"{', '.join(f'{count} {kind}' for kind, count in kept.items()) or 'none'}; remove precision.fp8"
        ]
    if kept:
        warnings.warn(
            f"precision.fp8: {len(swapped)} linear layers compute in float8; kept in the parameters' "
            f"precision: {', '.join(f'{count} {kind}' for kind, count in kept.items())} (fused QKV modules, "
            "stacked experts, routers, key/value projections a kv_replicator replicates and layers whose "
            "sizes are not multiples of 16)",
            ConfigNotice,
            stacklevel=2,
        )
    return []


def _float8_split_problem(
    family: ModelFamily | LoraFamily, model: torch.nn.Module, swapped: list[str], tp: int
) -> str | None:
    """The first float8 layer whose part on a tensor-parallel rank torch._scaled_mm cannot take, or None."""
    split = {"colwise": "out_features", "colwise_kv": "out_features", "rowwise": "in_features"}
    plan = family.tp_plan()
    for name in swapped:
        styles = [style for pattern, style in plan.items() if fnmatch.fnmatchcase(name, pattern) and style in split]
        if styles and (size := getattr(model.get_submodule(name), split[styles[0]])) % (FLOAT8_MATMUL_MULTIPLE * tp):
            return (
                f"precision.fp8: under tensor parallelism each rank runs {name}'s float8 matmul on its part of "
                f"{split[styles[0]]} ({size} / {tp}), which torch._scaled_mm needs to be a multiple of "
                f"{FLOAT8_MATMUL_MULTIPLE}; expected a distributed_strategy.tensor_model_parallel_size that "
                f"leaves it so, found {tp}"
            )
    return None


def _float8_only_layer(family: ModelFamily | LoraFamily, model: torch.nn.Module, swapped: list[str]) -> str | None:
    """The first decoder layer of `model` (a meta tree) whose parameters are all float8 layers' weights (torchao
    wraps the weight only; a bias keeps its dtype), or None."""
    names = {id(module): name for name, module in model.named_modules()}
    weights = {f"{name}.weight" for name in swapped}
    for layer in family.decoder_layers(model):
        prefix = names[id(layer)]
        held = {f"{prefix}.{name}" for name, _ in layer.named_parameters()}
        if held and held <= weights:
            return prefix
    return None


def _mup_spec(mup: MupConfig, config: GPTConfig) -> MupSpec:
    """nxd-models' muP settings: the base shapes read from base_shapes_file, or (save_base_shapes) the model's own,
    which it is about to write."""
    if mup.save_base_shapes:
        shapes = tuple((name, tuple(shape)) for name, shape in gpt_base_shapes(config, mup.width_scale).items())
    else:
        shapes = read_base_shapes(mup.base_shapes_file)
    return MupSpec(
        shapes,
        init_scale=mup.init_scale,
        attention_temperature=mup.attention_temperature,
        output_temperature=mup.output_temperature,
        embedding_multiplier=mup.embedding_multiplier,
    )


def write_base_shapes(cfg: NxdConfig) -> Path:
    """model.mup.save_base_shapes: the model's base shapes written to base_shapes_file (mup's YAML); the vocabulary
    and sequence are no widths, so the file does not depend on the data."""
    mup = cfg.model.mup
    config = _megatron_model(cfg, PLACEHOLDER_VOCABULARY, cfg.seq_length or 1, mup=False)
    path = Path(mup.base_shapes_file)
    save_atomically(path, base_shapes_text(gpt_base_shapes(config, mup.width_scale)).encode())
    return path


def sparsity_spec(sparse: SparseAttentionConfig, seed: int) -> SparsitySpec:
    """nxd-models' block-sparse settings from `model.sparse_attention`; random blocks are drawn with the run's seed."""
    return SparsitySpec(seed=seed, **sparse.model_dump())


def moe_spec(moe: MoEConfig | None) -> MoESpec | None:
    """nxd-models' MoE layer from the `model.moe` block (None without one)."""
    if moe is None:
        return None
    return MoESpec(
        num_experts=moe.num_experts,
        top_k=moe.top_k,
        frequency=moe.frequency,
        routing=moe.routing_algorithm,
        router_activation=moe.router_activation,
        normalize_top_k_affinities=moe.normalize_top_k_affinities,
        capacity_factor=None if moe.dropless else moe.capacity_factor,
        dropout=moe.dropout,
        sinkhorn_iterations=moe.sinkhorn_iterations,
        sinkhorn_tol=moe.sinkhorn_tol,
        router_aux_loss=moe.output_router_logits,
        router_aux_loss_coef=moe.router_aux_loss_coef,
        jitter_eps=moe.jitter_eps,
        eval_capacity_factor=moe.eval_capacity_factor,
        min_capacity=moe.min_capacity,
        residual=moe.residual,
        glu=moe.glu,
        random_token_selection=moe.random_token_selection,
        sample_second_expert=moe.sample_second_expert,
    )


def _hf_model(cfg: NxdConfig, vocab_size: int, seq_length: int) -> PretrainedConfig:
    m = cfg.model
    overrides = HFOverrides(
        m.num_layers,
        m.hidden_size,
        m.max_position_embeddings,
        m.rope_theta,
        qkv_linear=m.qkv_linear,
        fuse_qkv=m.fuse_qkv,
        moe=moe_spec(m.moe),
    )
    config = load_hf_config(m.hf_model_config, overrides)
    problems = []
    if config.vocab_size < vocab_size:
        problems.append(
            f"{m.hf_model_config}: vocab_size: expected at least the tokenizer's {vocab_size} tokens, "
            f"found {config.vocab_size}"
        )
    if seq_length > config.max_position_embeddings:
        problems.append(
            f"data.seq_length: expected at most max_position_embeddings ({config.max_position_embeddings}) "
            f"of {m.hf_model_config}, found {seq_length}"
        )
    if problems:
        raise ModelConfigError(*problems)
    return config


def accelerator_name() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


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


def _path(value: str | None) -> Path | None:
    return None if value is None else Path(value)


def _resume(cfg: NxdConfig) -> tuple[Resume | None, Path | None]:
    """The checkpoint the resume keys select and the log directory a resumed run continues in, with
    notices for checkpoints passed over and resume keys that change nothing here. A run that starts
    from initial weights (weight_init_only) and is restarted with resume_if_exists continues from its
    newest complete checkpoint."""
    exp = cfg.exp_manager
    search = (
        resumable_log_dir(_path(exp.explicit_log_dir), _path(exp.exp_dir), exp.name or cfg.name)
        if exp.resume_if_exists
        else None
    )
    with warnings.catch_warnings(record=True) as skipped:
        warnings.simplefilter("always", CheckpointWarning)
        try:
            resume = resume_choice(cfg, search)
        except CheckpointError as error:
            raise PreflightError([str(error)]) from None
    for warning in skipped:
        warnings.warn(str(warning.message), ConfigNotice, stacklevel=3)
    if resume is None and exp.resume_if_exists:
        warnings.warn(
            f"exp_manager.resume_if_exists: no complete checkpoint under {search}; starting a new run "
            "(resume_ignore_no_checkpoint)",
            ConfigNotice,
            stacklevel=3,
        )
    if cfg.model.weight_init_only and resume is None:
        warnings.warn(
            "model.weight_init_only: no checkpoint is loaded, so it changes nothing", ConfigNotice, stacklevel=3
        )
    if resume is not None and resume.neox:
        for key, value, inert in (
            ("resume_rng", exp.resume_rng, False),
            ("resume_schedule", exp.resume_schedule, "checkpoint"),
        ):
            if value == inert:
                warnings.warn(
                    f"exp_manager.{key}: {value} changes nothing when starting from the GPT-NeoX checkpoint "
                    f"{resume.path}: only its weights are read; random states and the schedule come from "
                    "this run",
                    ConfigNotice,
                    stacklevel=3,
                )
    continues = resume is not None and exp.resume_if_exists and not exp.resume_from_checkpoint
    both = resume is not None and exp.resume_from_checkpoint and search is not None
    if both and (found := latest_checkpoint(search / CHECKPOINT_DIR)) is not None:
        # NeMo's precedence: the log directory's newest checkpoint wins over resume_from_checkpoint (a run
        # started from initial weights, a LoRA run on its base, continues from its own checkpoint)
        if not resume.weights_only and found.path.resolve() != resume.path:
            warnings.warn(
                f"exp_manager.resume_from_checkpoint: {resume.path} passed over: with resume_if_exists the "
                f"log directory's newest checkpoint, {found.path}, is where the run continues (NeMo's "
                "precedence)",
                ConfigNotice,
                stacklevel=3,
            )
        return Resume.of_checkpoint(found, weights_only=False), search
    return resume, search if continues else None


def _notices(cfg: NxdConfig, policy: PrecisionPolicy) -> None:
    """Keys that are valid but change nothing in this run, said once before launch."""
    params = cfg.exp_manager.checkpoint_callback_params
    if cfg.exp_manager.create_checkpoint_callback and not (params.save_top_k or params.save_last):
        warnings.warn(
            "exp_manager.checkpoint_callback_params.save_top_k: 0 keeps no checkpoint and save_last is "
            "False, so this run writes none",
            ConfigNotice,
            stacklevel=3,
        )
    if params.use_master_weights_in_ckpt and policy.master_dtype is None:
        warnings.warn(
            f"exp_manager.checkpoint_callback_params.use_master_weights_in_ckpt: precision "
            f"{cfg.precision.type} keeps no master weights; checkpoints hold the model weights",
            ConfigNotice,
            stacklevel=3,
        )
    if neuron_keys := cfg.set_keys_with_status(Status.NEURON_ONLY):
        warnings.warn(f"acted on only on AWS Neuron devices: {', '.join(neuron_keys)}", ConfigNotice, stacklevel=3)
    ds = cfg.distributed_strategy
    if ds.tensor_model_parallel_size == 1:
        for key, value, default in (
            ("sequence_parallel", ds.sequence_parallel, False),
            ("kv_replicator", ds.kv_replicator, 1),
        ):
            if value != default:
                warnings.warn(
                    f"distributed_strategy.{key}: {value} acts across tensor-parallel ranks; with "
                    "tensor_model_parallel_size 1 it changes nothing",
                    ConfigNotice,
                    stacklevel=3,
                )
    if cfg.data.tokenizer is not None and not cfg.data.tokenizer.use_fast:
        warnings.warn(
            "data.tokenizer.use_fast: False asks for transformers' Python tokenizer; nxd reads the Rust "
            "(fast) one, built from the same files, which gives the same ids",
            ConfigNotice,
            stacklevel=3,
        )
    if ds.context_parallel_size == 1 and cfg.model.fusions.ring_attention:
        warnings.warn(
            "model.fusions.ring_attention: True acts across context-parallel ranks; with "
            "context_parallel_size 1 attention runs unsplit",
            ConfigNotice,
            stacklevel=3,
        )
    if (why := _capturable_off(cfg)) is not None:
        warnings.warn(
            f"model.optim.capturable: True matters to CUDA graph capture only; {why}, so the step runs "
            "uncaptured (the same updates)",
            ConfigNotice,
            stacklevel=3,
        )
    if ds.cpu_offload and accelerator_name() == "cpu":
        warnings.warn(
            "distributed_strategy.cpu_offload: on a CPU run the shards are in host memory already; it "
            "frees no device memory here",
            ConfigNotice,
            stacklevel=3,
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
        start_step=p.start_step, stop_step=p.stop_step, trace=p.enabled, memory=p.memory, memory_dir=_path(p.memory_dir)
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


SCHEDULE_KEYS = ("lr", "sched")
"""model.optim keys that make the learning-rate schedule (exp_manager.resume_schedule)."""


def _resumed_schedule(cfg: NxdConfig, resume: Resume | None) -> NxdConfig:
    """`cfg` with the learning rate and schedule exp_manager.resume_schedule picks when continuing from an
    nxd checkpoint: this config's, the one the checkpoint recorded, or this config's when they are the same."""
    choice = cfg.exp_manager.resume_schedule
    if choice == "config" or resume is None or resume.weights_only:
        return cfg
    optim = cfg.model.optim
    saved = read_info(resume.path).extra.get("config", {}).get("model", {}).get("optim", {})
    ours = optim.model_dump(mode="json", by_alias=True)
    differ = [key for key in SCHEDULE_KEYS if key in saved and saved[key] != ours.get(key)]
    if not differ:
        return cfg
    if choice == "same":
        found = "; ".join(f"model.optim.{key}: {ours.get(key)} here, {saved[key]} in the checkpoint" for key in differ)
        raise PreflightError(
            [
                f"exp_manager.resume_schedule: same: the learning-rate schedule differs from the one "
                f"{resume.path} recorded ({found}); expected the same, or resume_schedule config (this "
                "file's) or checkpoint (the checkpoint's); in a GPT-NeoX file override_lr_scheduler or "
                "use_checkpoint_lr_scheduler"
            ]
        )
    replaced = type(optim).model_validate({**ours, **{key: saved[key] for key in differ}})
    warnings.warn(
        f"exp_manager.resume_schedule: checkpoint: model.optim {', '.join(differ)} from {resume.path}",
        ConfigNotice,
        stacklevel=3,
    )
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"optim": replaced})})


def _resume_changes(cfg: NxdConfig, resume: Resume | None, identity: dict, source_key: str) -> list[str]:
    """Settings changed since the checkpoint a run continues was saved: those that cannot continue it, as
    one problem; the hyperparameters it applies from the first resumed step, as one notice."""
    if resume is None or resume.weights_only:
        return []
    saved = read_info(resume.path).extra
    refused, applied = compare(
        saved.get("config", {}),
        saved.get(IDENTITY, {}),
        cfg.model_dump(mode="json", by_alias=True),
        identity,
        source_key,
    )
    if not cfg.exp_manager.resume_optimizer:  # a fresh optimizer: its name and settings may change
        refused = [line for line in refused if not line.startswith("model.optim.")]
        applied = []
    if applied:
        warnings.warn(
            f"resuming {resume.path} with changed settings, applied from its first step: {'; '.join(applied)}",
            ConfigNotice,
            stacklevel=3,
        )
    if not refused:
        return []
    return [
        f"{resume.path}: cannot continue this checkpoint with changed settings that shape its state or data "
        f"position: {'; '.join(refused)}; expected the settings it was saved with, or model.weight_init_only: "
        "True to start a new run from its weights"
    ]


def _capturable_off(cfg: NxdConfig) -> str | None:
    """Why torch's capturable step (which needs the optimizer's tensors on CUDA) cannot run here, when
    model.optim.capturable asks for it: NxDT's examples set it for Neuron devices."""
    if not getattr(cfg.model.optim, "capturable", False):
        return None
    if (accelerator := accelerator_name()) != "cuda":
        return f"this run's tensors are on {accelerator}"
    return "distributed_strategy.cpu_offload steps on host tensors" if cfg.distributed_strategy.cpu_offload else None


def _settings(
    cfg: NxdConfig,
    policy: PrecisionPolicy,
    decode: Callable[[list[int]], str] | None,
    world: LaunchWorld | None = None,
    job: Job | None = None,
) -> dict:
    """The loop's settings: cadence, launch, batches, update, logging and checkpoints; `decode` counts the
    characters of evaluated samples (trainer.char_level_ppl)."""
    t, exp, d, optim = cfg.trainer, cfg.exp_manager, cfg.data, cfg.model.optim
    ds = cfg.distributed_strategy
    options = {name: getattr(optim, name) for name in type(optim).model_fields if name not in ("name", "sched")}
    if _capturable_off(cfg) is not None:
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
            tp=ds.tensor_model_parallel_size,
            pp=ds.pipeline_model_parallel_size,
            cp=ds.context_parallel_size,
            ep=ds.expert_model_parallel_size,
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
            explicit_log_dir=_path(exp.explicit_log_dir),
            exp_dir=_path(exp.exp_dir),
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


SAMPLE_INDEX_BYTES = 20
"""Bytes per training sample of Megatron's indices (shuffle entry, sample start, and documents)."""
MAX_PARAMETERS = 10**13
MAX_LAYERS = 4096


def _earlier_run_problems(folder: Path, cfg: NxdConfig) -> list[str]:
    """An earlier run's records in the explicit log directory of a run that does not resume it: refused, naming
    the keys that changed (a new run there would write over its config.yaml, metrics.csv and checkpoints)."""
    if not (records := earlier_records(folder)):
        return []
    if (previous := earlier_config(folder)) is not None:
        changes = list(itertools.islice(changed_keys(previous, cfg.model_dump(mode="json", by_alias=True)), 6))
        more = "; and more" if len(changes) > 5 else ""
        what = f"keys changed since: {'; '.join(changes[:5])}{more}" if changes else "the same config"
    else:
        what = "no config.yaml to compare"
    return [
        f"exp_manager.explicit_log_dir: {folder} holds an earlier run's {', '.join(records)} ({what}); this run "
        "does not resume it and would write over them: expected a new folder. Name another "
        "exp_manager.explicit_log_dir, continue that run (exp_manager.resume_if_exists=True), or write "
        "exp_manager.require_empty_log_dir=False to write over its records"
    ]


def _files_in(folder: Path) -> str:
    """What `folder` holds, in a few words ('' when it is missing or empty; the run lock file counts for
    nothing)."""
    if not folder.is_dir():
        return ""
    names = sorted(p.name for p in folder.iterdir() if p.name != LOCK_FILE)
    if not names:
        return ""
    more = ", ..." if len(names) > 3 else ""
    return f"{len(names)} entr{'y' if len(names) == 1 else 'ies'} ({', '.join(names[:3])}{more})"


def _early_stopping(cfg: NxdConfig) -> EarlyStopping | None:
    exp = cfg.exp_manager
    if not exp.create_early_stopping_callback:
        return None
    params = exp.early_stopping_callback_params
    return EarlyStopping(patience=params.patience, min_delta=params.min_delta)


def _sample_index_problem(cfg: NxdConfig, train_samples: int) -> str | None:
    """Why the Megatron sample index of `train_samples` samples cannot be built on this machine (more
    than half its memory), before anything is built; None for other data or when it fits."""
    if cfg.data.train_dir is not None or cfg.model_alignment_strategy is not None:
        return None  # records and Hugging Face data are read as they are, epoch after epoch
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    needed = train_samples * SAMPLE_INDEX_BYTES
    if needed <= memory // 2:
        return None
    return (
        f"trainer.max_steps: {cfg.trainer.max_steps:,} steps x data.global_batch_size {cfg.global_batch_size:,} = "
        f"{train_samples:,} samples; their index takes about {needed / 2**30:,.0f} GiB, expected at most half of "
        f"this machine's {memory / 2**30:,.0f} GiB memory (fewer steps or a smaller global batch)"
    )


def _model_size_problem(cfg: NxdConfig, family: ModelFamily | LoraFamily) -> str | None:
    """Why the model is beyond what nxd builds (counted from its sizes, before any module exists)."""
    spec = getattr(family, "base", family).spec
    if isinstance(spec, GPTConfig):
        layers, hidden, ffn, vocab = spec.num_layers, spec.hidden_size, spec.ffn_size, spec.padded_vocab_size
        attention = hidden * spec.head_dim * (2 * spec.num_attention_heads + 2 * spec.kv_heads)
        source = "model"
    else:
        layers, hidden, vocab = spec.num_hidden_layers, spec.hidden_size, spec.vocab_size
        ffn, attention, source = spec.intermediate_size, 4 * spec.hidden_size**2, "model.model_config"
    if layers > MAX_LAYERS:
        return (
            f"model.num_layers: expected at most {MAX_LAYERS} decoder layers (the largest published models have "
            f"under 200; building more takes minutes before the first step), found {layers:,}"
        )
    parameters = 2 * vocab * hidden + layers * (attention + 3 * hidden * ffn)
    if parameters > MAX_PARAMETERS:
        return (
            f"{source}: hidden_size {hidden:,}, {layers:,} layers, ffn {ffn:,} and vocabulary {vocab:,} make about "
            f"{parameters:.1e} parameters; expected at most {MAX_PARAMETERS:.0e} (a hundred times the largest "
            "published models)"
        )
    return None


def _family(
    cfg: NxdConfig, vocab_size: int, seq_length: int, prompt_ids: tuple[int, ...] = ()
) -> ModelFamily | LoraFamily:
    """The model family, with LoRA adapters when `model_alignment_strategy.peft` asks for them; `prompt_ids`
    start a soft prompt (model.soft_prompt.init_string's tokens)."""
    spec = (
        _hf_model(cfg, vocab_size, seq_length)
        if cfg.model_source == "hf"
        else _megatron_model(cfg, vocab_size, seq_length, prompt_ids)
    )
    fusions = cfg.model.fusions
    family = model_family(
        spec,
        AttentionKernel.from_fusions(fusions.flash_attention, fusions.softmax),
        head="score" if _method(cfg) == "reward_model" else "causal_lm",
        loss_chunk_tokens=fusions.loss_chunk_tokens,
    )
    if cfg.model.mup is not None:  # muP's widths read the base shapes as the family's one meta build is made
        family.parameter_shapes()
    if (peft := _peft(cfg)) is None:
        return family
    return LoraFamily(
        family,
        LoraSpec(
            rank=peft.lora_rank,
            alpha=peft.lora_alpha,
            dropout=peft.lora_dropout,
            bias=peft.lora_bias,
            targets=tuple(peft.target_modules),
        ),
    )


def _model_vocabulary(cfg: NxdConfig) -> ModelVocabulary | None:
    """For Hugging Face data already tokenised and no data.tokenizer (NxDT's HF recipes): the vocabulary
    size and end-of-document id of the model's config.json; None when a tokenizer is set or the model
    is not a Hugging Face one."""
    if cfg.data.tokenizer is not None or cfg.model_source != "hf" or not cfg.model.hf_model_config:
        return None
    config = load_hf_config(cfg.model.hf_model_config)
    path = Path(cfg.model.hf_model_config)
    source = str(path / "config.json" if path.is_dir() else path)
    eos = config.eos_token_id[0] if isinstance(config.eos_token_id, list | tuple) else config.eos_token_id
    if not isinstance(eos, int):
        raise ModelConfigError(
            f"{source}: eos_token_id: expected the end-of-document id that pre-tokenised data "
            f"is padded with (or set data.tokenizer), found {config.eos_token_id!r}"
        )
    return ModelVocabulary(config.vocab_size, eos, source)


def _preference(cfg: NxdConfig) -> DPOConfig | ORPOConfig | KTOConfig | RewardModelConfig | None:
    """The dpo, orpo, kto or reward_model block, when the run trains on preference data."""
    alignment = cfg.model_alignment_strategy
    if alignment is None:
        return None
    return alignment.dpo or alignment.orpo or alignment.kto or alignment.reward_model


def _objective(cfg: NxdConfig) -> Objective:
    block = _preference(cfg)
    if isinstance(block, DPOConfig):
        settings = {
            "beta": block.kl_beta,
            "loss_type": block.loss_type,
            "label_smoothing": block.label_smoothing,
            "reference_free": block.reference_free,
        }
    elif isinstance(block, KTOConfig):
        settings = {
            "beta": block.beta,
            "desirable_weight": block.desirable_weight,
            "undesirable_weight": block.undesirable_weight,
            "kl_estimate": block.kl_estimate,
        }
    elif isinstance(block, RewardModelConfig):
        settings = {"z_loss": block.z_loss}
    else:
        settings = {} if block is None else {"beta": block.beta}
    return objective_for(_method(cfg), **settings)


def _initial_weights(cfg: NxdConfig, resume: Resume | None) -> Resume | None:
    """The weights the run started from at step 0 (weight_init_only), even when it now continues from
    its own checkpoint; None: the seeded initialisation."""
    if resume is not None and resume.weights_only:
        return resume
    if cfg.model.weight_init_only and cfg.exp_manager.resume_from_checkpoint:
        return resume_choice(cfg, None)
    return None


def _reference(
    cfg: NxdConfig, resume: Resume | None, family: ModelFamily | LoraFamily, data: DataSplits, policy: PrecisionPolicy
) -> Reference | None:
    """DPO's and KTO's reference: precomputed or live, from the initial weights, with the digest of its
    table; none for reference-free DPO or where the data carries the reference log-probs."""
    block = _preference(cfg)
    if (
        not isinstance(block, DPOConfig | KTOConfig)
        or getattr(block, "reference_free", False)
        or data.reference_in_data
    ):
        return None
    initial = _initial_weights(cfg, resume)
    parts = {
        "model": str(family.spec),
        "attention": str(family.attention),
        "seq_length": cfg.seq_length,
        "initial": f"seed {cfg.seed}" if initial is None else str(initial.path),
        "policy": repr(policy),
        "train": data.train.fingerprint,
        "validation": None if data.validation is None else data.validation.fingerprint,
        **({} if data.test is None else {"test": data.test.fingerprint}),
    }
    return Reference(
        precompute=block.precompute_ref_log_probs,
        initial=initial,
        digest=reference_digest(parts),
        kl_baseline=isinstance(block, KTOConfig) and block.kl_estimate == "mismatched",
    )


def _peft(cfg: NxdConfig):  # noqa: ANN202 - the config's PeftConfig or None
    return None if cfg.model_alignment_strategy is None else cfg.model_alignment_strategy.peft


def _adapters(cfg: NxdConfig, resume: Resume | None) -> Adapters | None:
    """LoRA's checkpoint settings, and where its base comes from when a checkpoint holds adapters only:
    a continuing run's initial weights (resume_from_checkpoint; when that names the adapter checkpoint itself,
    the weights its run started from, else model.model_config), or with load_lora_from_ckpt model.model_config."""
    if (peft := _peft(cfg)) is None:
        return None
    base, source = "frozen" if peft.save_lora_base else "merged" if peft.merge_lora else None, None
    exp = cfg.exp_manager
    directory = Path(cfg.model.hf_model_config) if cfg.model.hf_model_config else None
    if resume is not None and not resume.weights_only and exp.resume_from_checkpoint:
        source = resume_choice(cfg, None)
        if not source.weights_only:  # resumed from the adapter checkpoint itself: the base its run started from
            saved = read_info(source.path).extra.get("config", {}).get("exp_manager", {}).get("resume_from_checkpoint")
            base_dir = Path(saved) if saved else directory
            source = Resume.of_hugging_face(base_dir) if base_dir is not None and is_hf_directory(base_dir) else None
    elif peft.load_lora_from_ckpt:
        if not (exp.resume_from_checkpoint and cfg.model.weight_init_only):
            raise PreflightError(
                [
                    "model_alignment_strategy.peft.load_lora_from_ckpt: expected the LoRA checkpoint "
                    "in exp_manager.resume_from_checkpoint with model.weight_init_only: True"
                ]
            )
        if directory is not None and is_hf_directory(directory):
            source = Resume.of_hugging_face(directory)
    return Adapters(
        base=base,
        config_file=peft.save_lora_config_adapter,
        single_file=peft.merge_sharded_lora,
        from_checkpoint=peft.load_lora_from_ckpt,
        verbose=peft.lora_verbose,
        base_source=source,
    )


PLACEHOLDER_VOCABULARY = 256
"""The vocabulary a model is checked with when the data (which gives the real one) could not be read."""


def plan_run(cfg: NxdConfig, cache_dir: Path, *, data_required: bool = True, here: bool = True) -> RunPlan:
    """The checked plan of a run, or one PreflightError listing every problem: the release, optimizer,
    checkpoint and precision keys, the data, the model and the layout are all checked, each stage
    going on from what the others could establish, so that one run shows everything to fix.

    Without `data_required` (a memory plan made where the data is not, which writes nothing: the log directory's
    earlier records are not looked at), data that cannot be read is a notice, and the plan has no data (a
    Megatron-style model then has a placeholder vocabulary). Without `here`
    (a job written for a cluster), the launch is not this process's."""
    world, problems = launcher_world(cfg, os.environ, here=here)
    job = job_of(world, os.environ)
    cfg = restarted(cfg, job)
    problems += _not_in_this_release(cfg) + _optimizer_problems(cfg) + checkpoint_problems(cfg)
    exp = cfg.exp_manager
    problems += log_dir_problems(
        _path(exp.explicit_log_dir),
        _path(exp.exp_dir),
        exp.name or cfg.name,
        "exp_manager.name" if exp.name and exp.name != cfg.name else "name",
        exp.create_checkpoint_callback and not exp.checkpoint_callback_params.filename,
    )
    continues = (exp.resume_from_checkpoint is not None and not cfg.model.weight_init_only) or exp.resume_if_exists
    if (
        exp.require_empty_log_dir
        and exp.explicit_log_dir
        and not continues
        and (held := _files_in(Path(exp.explicit_log_dir)))
    ):
        problems.append(
            f"exp_manager.explicit_log_dir: {exp.explicit_log_dir} already holds {held}; expected an "
            "empty or new folder (exp_manager.require_empty_log_dir: True; a QEfficient file's "
            "training.overwrite_output_dir: false), so that nothing there is written over: name another "
            "folder, resume the run that is there, or allow writing beside what is there"
        )
    elif exp.explicit_log_dir and not continues and not exp.is_set("require_empty_log_dir") and data_required:
        problems += _earlier_run_problems(Path(exp.explicit_log_dir), cfg)
    d = cfg.data
    no_validation = (d.dataset is not None and not (d.dataset.validation_split or d.dataset.split_ratio)) or (
        d.train_dir is not None and d.val_dir is None and not d.is_set("data_prefix")
    )
    if exp.create_early_stopping_callback and no_validation:
        problems.append(
            "exp_manager.create_early_stopping_callback: expected validation data to judge (data.val_dir, "
            "or data.dataset's validation_split or split_ratio), found none"
        )
    if exp.create_early_stopping_callback and cfg.trainer.limit_val_batches == 0:
        problems.append(
            "exp_manager.create_early_stopping_callback: expected validation to judge (trainer."
            "limit_val_batches above 0), found limit_val_batches 0"
        )
    for key, wanted, module, extra, package in (
        ("create_wandb_logger", exp.create_wandb_logger, "wandb", "wandb", "wandb"),
        ("create_comet_logger", exp.create_comet_logger, "comet_ml", "comet", "comet-ml"),
        ("s3_checkpoints.path", exp.s3_checkpoints.path is not None, "boto3", "s3", "boto3"),
    ):
        if wanted and importlib.util.find_spec(module) is None:
            problems.append(
                f"exp_manager.{key}: expected the {package} package, found it not installed; install "
                f"nxd-train[{extra}] (pip install {package})"
            )
    if exp.s3_checkpoints.path is not None and not exp.create_checkpoint_callback:
        problems.append(
            "exp_manager.s3_checkpoints.path: expected checkpoints to upload (exp_manager."
            "create_checkpoint_callback True), found checkpointing off"
        )
    policy, device = None, torch.device(accelerator_name())
    try:
        policy = precision_policy(cfg)
    except PrecisionConfigError as error:
        problems.append(str(error))
    else:
        for problem in (
            bf16_support_problem(policy, device),
            policy.float8 and float8_support_problem(policy.float8, device),
            cfg.model.optim.name == "adam8bit" and adam8bit_support_problem(device),
        ):
            if problem:
                problems.append(problem)
        _notices(cfg, policy)
    resume = log_dir = None
    try:
        resume, log_dir = _resume(cfg)
        cfg = _resumed_schedule(cfg, resume)
    except PreflightError as error:
        problems += error.problems
    seq_length, unread = cfg.seq_length, []
    (problems if data_required else unread).extend(data_left_out(cfg.data, fine_tuning=_method(cfg) is not None))
    train_samples = cfg.trainer.max_steps * cfg.global_batch_size if cfg.trainer.max_steps > 0 else None
    data = None
    if train_samples is not None and (index_problem := _sample_index_problem(cfg, train_samples)):
        problems.append(index_problem)
    elif not any(problem.startswith("data.") for problem in problems):  # else the data keys themselves are wrong
        try:
            alignment = cfg.model_alignment_strategy
            data = build_datasets(
                cfg.data,
                seq_length,
                cache_dir,
                train_samples=train_samples,
                seed=cfg.seed,
                sft=None if alignment is None else alignment.sft,
                preference=_preference(cfg),
                vocabulary=_model_vocabulary(cfg),
                trust_remote_code=cfg.model.trust_remote_code,
            )
        except DataError as error:
            (problems if data_required else unread).append(str(error))
        except ModelConfigError as error:
            problems += error.problems
    if data is not None and len(data.train) < cfg.global_batch_size:
        problems.append(
            f"data.global_batch_size: expected at most the {len(data.train)} samples of the training "
            f"split, found {cfg.global_batch_size}"
        )
    family, prompt_ids = None, ()
    if data is not None and (prompt := cfg.model.soft_prompt) is not None and prompt.init_string:
        try:
            (prompt_ids,) = run_tokenizer(cfg.data, cache_dir, cfg.model.trust_remote_code).encode([prompt.init_string])
            if not prompt_ids:
                problems.append(
                    f"model.soft_prompt.init_string: expected text of at least one token, found {prompt.init_string!r}"
                )
        except DataError as error:
            problems.append(f"model.soft_prompt.init_string: needs the run's tokenizer: {error}")
    decode = None
    if data is not None and cfg.trainer.char_level_ppl:
        try:
            decode = run_tokenizer(cfg.data, cache_dir, cfg.model.trust_remote_code).decode
        except DataError as error:
            problems.append(f"trainer.char_level_ppl: counts characters with the run's tokenizer: {error}")
    try:
        family = _family(
            cfg, PLACEHOLDER_VOCABULARY if data is None else data.vocab_size, seq_length, tuple(prompt_ids)
        )
    except ModelConfigError as error:
        problems += [problem for problem in error.problems if data is not None or "vocab_size" not in problem]
    if family is not None and (size_problem := _model_size_problem(cfg, family)):
        problems.append(size_problem)
        family = None
    if (
        family is not None
        and policy is not None
        and policy.float8 is not None
        and not any(problem.startswith("precision.fp8") for problem in problems)
    ):
        ds = cfg.distributed_strategy
        policy = replace(policy, float8=_float8_spec(family, policy.float8, ds.kv_replicator))
        problems += _float8_coverage(family, policy.float8, device, ds.tensor_model_parallel_size)
    layout = layout_of(cfg, policy or resolve_policy("fp32"))
    if family is not None:
        ds = cfg.distributed_strategy
        problems += layout_problems(
            family, layout, ds.tensor_model_parallel_size, ds.pipeline_model_parallel_size, ds.context_parallel_size
        )
    if family is not None and (problem := head_problem(family, resume)):
        problems.append(problem)
    if family is not None and not problems:
        problems += initial_weights_problems(family, _initial_weights(cfg, resume))
    identity = {}
    recorded = cfg.exp_manager.create_checkpoint_callback or (resume is not None and not resume.weights_only)
    if family is not None and data is not None and recorded:  # what checkpoints record and resumes compare
        identity = {
            "architecture": architecture(family),
            "tokenizer": data.tokenizer_fingerprint,
            "data": data_identity(cfg.data.model_dump(mode="json", by_alias=True)),
        }
        problems += _resume_changes(cfg, resume, identity, family.source_key)
    for problem in unread:
        warnings.warn(
            f"the data was not read ({problem}); planning with the model's vocabulary"
            + ("" if cfg.model_source == "hf" else f", or {PLACEHOLDER_VOCABULARY} tokens"),
            ConfigNotice,
            stacklevel=2,
        )
    if problems:
        raise PreflightError(list(dict.fromkeys(problems)))
    return RunPlan(
        family,
        data,
        seq_length,
        layout=layout,
        policy=policy,
        objective=_objective(cfg),
        adapters=_adapters(cfg, resume),
        reference=None if data is None else _reference(cfg, resume, family, data, policy),
        resume=resume,
        log_dir=log_dir,
        identity=identity,
        **_settings(cfg, policy, decode, world, job),
    )
