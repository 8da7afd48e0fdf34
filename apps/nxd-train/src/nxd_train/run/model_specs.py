"""The config's model as nxd-models' specs: a Megatron-style `GPTConfig` (its layer kinds' settings, MoE, sparsity
and muP), or a Hugging Face config with NxDT's overrides, and the family (with LoRA adapters) that builds it."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nxd_align import LoraFamily, LoraSpec
from nxd_config import NxdConfig
from nxd_config.schema.model import MoEConfig, MupConfig, SparseAttentionConfig
from nxd_data import save_atomically
from nxd_models import (
    AttentionKernel,
    GPTConfig,
    HFOverrides,
    ModelConfigError,
    ModelFamily,
    MoESpec,
    MupSpec,
    SparsitySpec,
    base_shapes_text,
    gpt_base_shapes,
    layer_kinds,
    load_hf_config,
    model_family,
    read_base_shapes,
)

from nxd_train.run.data import ModelVocabulary

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def megatron_model(
    cfg: NxdConfig, vocab_size: int, seq_length: int, prompt_ids: tuple[int, ...] = (), *, mup: bool = True
) -> GPTConfig:
    """The Megatron-style model of `cfg` (without muP's settings when `mup` is False): every model key of a
    `GPTConfig` field's name passes through as it is; the others are given here."""
    m, prompt = cfg.model, cfg.model.soft_prompt
    given = {
        "vocab_size": vocab_size,
        "seq_length": seq_length,
        "tensor_parallel_size": cfg.distributed_strategy.tensor_model_parallel_size,
        "rope_theta": m.rope_theta or 10000.0,
        "sliding_window": m.sliding_window_size,
        "loss_chunk_tokens": m.fusions.loss_chunk_tokens,
        "moe": moe_spec(m.moe),
        "mup": None,
        "layer_settings": layer_settings(cfg),
        "soft_prompt_tokens": 0 if prompt is None else prompt.n_tokens,
        "soft_prompt_init_range": 0.5 if prompt is None else prompt.init_range,
        "soft_prompt_init_ids": prompt_ids,
    }
    same = {f.name: getattr(m, f.name) for f in fields(GPTConfig) if f.name in type(m).model_fields}
    config = GPTConfig(**{**same, **given})
    if not mup or m.mup is None:
        return config
    return replace(config, mup=_mup_spec(m.mup, config))


def layer_settings(cfg: NxdConfig) -> tuple[Any, ...]:
    """Each layer kind's settings from the model keys named `<kind>_<field>` (model.mamba_inner_size is
    `MambaSpec.inner_size`; kinds sharing a settings class read the first one's keys, a field without a key keeps its
    default), the block-sparse layouts' from model.sparse_attention."""
    m = cfg.model
    specs = {SparsitySpec: sparsity_spec(m.sparse_attention, cfg.seed)}
    for kind in layer_kinds():
        if kind.settings is not None and kind.settings not in specs:
            keys = {f.name: f"{kind.name}_{f.name}" for f in fields(kind.settings)}
            specs[kind.settings] = kind.settings(**{k: getattr(m, key) for k, key in keys.items() if hasattr(m, key)})
    return tuple(specs.values())


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
    config = megatron_model(cfg, PLACEHOLDER_VOCABULARY, cfg.seq_length or 1, mup=False)
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


def hf_model(cfg: NxdConfig, vocab_size: int, seq_length: int) -> PretrainedConfig:
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


def run_family(
    cfg: NxdConfig, vocab_size: int, seq_length: int, prompt_ids: tuple[int, ...] = ()
) -> ModelFamily | LoraFamily:
    """The model family, with LoRA adapters when `model_alignment_strategy.peft` asks for them; `prompt_ids`
    start a soft prompt (model.soft_prompt.init_string's tokens)."""
    spec = (
        hf_model(cfg, vocab_size, seq_length)
        if cfg.model_source == "hf"
        else megatron_model(cfg, vocab_size, seq_length, prompt_ids)
    )
    fusions = cfg.model.fusions
    family = model_family(
        spec,
        AttentionKernel.from_fusions(fusions.flash_attention, fusions.softmax),
        head="score" if training_method(cfg) == "reward_model" else "causal_lm",
        loss_chunk_tokens=fusions.loss_chunk_tokens,
    )
    if cfg.model.mup is not None:  # muP's widths read the base shapes as the family's one meta build is made
        family.parameter_shapes()
    if (peft := peft_config(cfg)) is None:
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


def model_vocabulary(cfg: NxdConfig) -> ModelVocabulary | None:
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


def peft_config(cfg: NxdConfig):  # noqa: ANN202 - the config's PeftConfig or None
    return None if cfg.model_alignment_strategy is None else cfg.model_alignment_strategy.peft


def training_method(cfg: NxdConfig) -> str | None:
    """The fine-tuning method (sft, dpo, orpo, kto, reward_model), or None to pretrain."""
    return None if cfg.model_alignment_strategy is None else cfg.model_alignment_strategy.method


PLACEHOLDER_VOCABULARY = 256
"""The vocabulary a model is checked with when the data (which gives the real one) could not be read."""
