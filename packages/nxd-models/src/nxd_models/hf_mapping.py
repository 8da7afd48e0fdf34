"""The Hugging Face counterpart of a model, declared as data for nxd-ckpt to apply.

A transformers model maps to itself. A Llama-shaped Megatron-style decoder (rmsnorm, swiglu,
full-width RoPE) is a `LlamaForCausalLM`, with a sliding window a `MistralForCausalLM`, and with
Mixtral's experts in every layer a `MixtralForCausalLM` (stacked experts map to the hub's one tensor
per expert). All use RoPE in the rotate-half layout (Megatron's default, `rotary_interleaved: False`),
so query and key weights need no permutation; the other transform is the vocabulary padding, sliced
off on export and added back on import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from .errors import ModelConfigError
from .gpt import GPTConfig
from .hf_moe import MOE_SPEC, mixtral_keys, moe_of
from .hf_qkv import QKV_LINEAR, hf_key

TIED_OUTPUT = {"lm_head.weight": "model.embed_tokens.weight"}


@dataclass(frozen=True)
class HFMapping:
    config: dict[str, Any]
    """config.json content for the Hugging Face model (transformers' keys, with `architectures`)."""
    keys: dict[str, str]
    """Our state-dict key -> the Hugging Face key."""
    vocab_size: int | None = None
    """The real vocabulary when our embedding rows are padded beyond it."""
    vocab_padded_keys: tuple[str, ...] = ()
    """Our keys whose first dimension is the padded vocabulary (keep the first `vocab_size` rows)."""
    tied: dict[str, str] = field(default_factory=dict)
    """Our key -> our key it shares storage with (not exported; filled from its source on import)."""
    stacked: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Our key -> the Hugging Face keys of its slices along the first dimension, in order (stacked experts)."""


def hf_mapping(config: GPTConfig) -> HFMapping:
    """The LlamaForCausalLM (MistralForCausalLM with a sliding window) that holds the same function as
    `config`; a clear error for other shapes."""
    mismatches = [
        f"{key} is {value!r} (Llama needs {needed!r})"
        for key, value, needed in (
            ("normalization", config.normalization, "rmsnorm"),
            ("activation", config.activation, "swiglu"),
            ("position_embedding_type", config.position_embedding_type, "rope"),
            ("rotary_percentage", config.rotary_percentage, 1.0),
        )
        if value != needed
    ]
    if config.sliding_window is not None and config.has_bias:
        mismatches.append("has_bias is True (Mistral, the sliding-window architecture, has no biases)")
    moe = config.moe
    if moe is not None:
        mismatches += [f"moe.{key} is {value!r} (Mixtral needs {needed!r})" for key, value, needed in (
            ("frequency", moe.frequency, 1), ("routing_algorithm", moe.routing, "top_k"),
            ("router_activation", moe.router_activation, "softmax"),
            ("normalize_top_k_affinities", moe.normalize_top_k_affinities, True),
            ("has_bias", config.has_bias, False)) if value != needed]  # fmt: skip
    if mismatches:
        raise ModelConfigError(
            "no Hugging Face architecture matches this Megatron-style model: " + "; ".join(mismatches)
        )
    mistral = config.sliding_window is not None
    architecture = "mixtral" if moe is not None else "mistral" if mistral else "llama"
    hf_config = {
        "architectures": [f"{architecture.capitalize()}ForCausalLM"],
        "model_type": architecture,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.ffn_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_positions,
        "initializer_range": config.init_method_std,
        "rms_norm_eps": config.layernorm_epsilon,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "attention_bias": config.has_bias,
        "mlp_bias": config.has_bias,
        "attention_dropout": 0.0,
        "tie_word_embeddings": config.share_embeddings_and_output_weights,
    }
    if mistral or moe is not None:
        hf_config["sliding_window"] = config.sliding_window
    if moe is not None:  # exported dropless: a capacity is a training-time limit
        hf_config.update(num_local_experts=moe.num_experts, num_experts_per_tok=moe.top_k,
                         output_router_logits=moe.router_aux_loss, router_aux_loss_coef=moe.router_aux_loss_coef)
        del hf_config["mlp_bias"]
    layer_keys = [
        "input_layernorm.weight", "post_attention_layernorm.weight",
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    ]  # fmt: skip
    if moe is not None:
        layer_keys = [key for key in layer_keys if not key.startswith("mlp.")]
    if config.has_bias:
        layer_keys += [k.replace(".weight", ".bias") for k in layer_keys if "proj" in k]
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    names += [f"model.layers.{i}.{key}" for i in range(config.num_layers) for key in layer_keys]
    vocab_keys = ["model.embed_tokens.weight"]
    if not config.share_embeddings_and_output_weights:
        names.append("lm_head.weight")
        vocab_keys.append("lm_head.weight")
    tied = TIED_OUTPUT if config.share_embeddings_and_output_weights else {}
    experts, stacked = mixtral_keys(config.moe_layers, moe.num_experts) if moe is not None else ({}, {})
    return HFMapping(hf_config, {**{_ours(name, config): name for name in names}, **experts}, config.vocab_size,
                     tuple(vocab_keys), tied, stacked)  # fmt: skip


def hf_self_mapping(config: PretrainedConfig, names: list[str]) -> HFMapping:
    """A transformers model's own layout: every state-dict key (`names`) maps to itself, but for the
    QKV module's (qkv_linear), which map to the q/k/v layers they came from, and a Mixtral's MoE
    layers, which map to the hub's per-expert layout."""
    content = {key: value for key, value in config.to_dict().items() if key not in (QKV_LINEAR, MOE_SPEC)}
    content["architectures"] = content.get("architectures") or [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    tied = TIED_OUTPUT if config.tie_word_embeddings else {}
    moe = moe_of(config)
    experts, stacked = ({}, {}) if moe is None else mixtral_keys(list(range(config.num_hidden_layers)),
                                                                  moe.num_experts)  # fmt: skip
    keys = {name: hf_key(name) for name in names if name not in tied and name not in stacked}
    return HFMapping(content, {**keys, **experts}, tied=tied, stacked=stacked)


def _ours(hf_name: str, config: GPTConfig) -> str:
    """Our key for a Llama key: identical, except the fused module's q/k/v parameters under qkv_linear."""
    for projection in ("q", "k", "v"):
        for kind in ("weight", "bias"):
            if config.qkv_linear and hf_name.endswith(f"self_attn.{projection}_proj.{kind}"):
                return hf_name.replace(f"{projection}_proj.{kind}", f"qkv_proj.{kind}_{projection}")
    return hf_name
