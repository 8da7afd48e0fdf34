"""The Hugging Face counterpart of a model, declared as data for nxd-ckpt to apply.

A transformers model maps to itself. A Llama-shaped Megatron-style decoder (rmsnorm, swiglu,
full-width RoPE) is a `LlamaForCausalLM`, with a sliding window a `MistralForCausalLM`, and with
Mixtral's experts in every layer a `MixtralForCausalLM` (stacked experts map to the hub's one tensor
per expert). A GPT-NeoX-shaped one (layernorm, an ungated MLP, RoPE on a fraction of each head, the
parallel gpt_neox block or pre_ln) is a `GPTNeoXForCausalLM`, whose one query_key_value matrix holds q,
k and v interleaved head by head. All use RoPE in the rotate-half layout (Megatron's default,
`rotary_interleaved: False`), so query and key weights need no permutation; the other transform is the
vocabulary padding, sliced off on export and added back on import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .activations import HF_ACTIVATIONS
from .errors import ModelConfigError
from .gpt import GPTConfig
from .hf_moe import MOE_SPEC, mixtral_keys, moe_of
from .hf_qkv import QKV_LINEAR, hf_key

if TYPE_CHECKING:
    from transformers import PretrainedConfig

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
    interleaved: dict[str, tuple[tuple[str, ...], int]] = field(default_factory=dict)
    """Hugging Face key -> (our keys, rows per head): one tensor holding our tensors' rows head by head, the
    first head's rows of each of ours in turn, then the second head's ... (GPT-NeoX's query_key_value)."""
    buffers: tuple[str, ...] = ()
    """Endings of Hugging Face keys that hold buffers rather than weights (older transformers saved GPT-NeoX's
    causal mask and rotary frequencies with the weights); an import passes over them."""


def hf_mapping(config: GPTConfig) -> HFMapping:
    """The Hugging Face model that holds the same function as `config`: LlamaForCausalLM (MistralForCausalLM
    with a sliding window, MixtralForCausalLM with experts) or GPTNeoXForCausalLM; a clear error naming the keys
    for shapes transformers has no class for. A soft prompt is left out (its weights have no Hugging Face key:
    a start from Hugging Face weights starts it fresh)."""
    if config.qk_layernorm:
        raise ModelConfigError(
            "no Hugging Face architecture matches this Megatron-style model: qk_layernorm is True "
            "(GPT-NeoX's norm over all heads of a token; transformers' query/key norms are per "
            "head)"
        )
    if config.mup is not None or config.position_embedding_multiplier != 1:
        raise ModelConfigError(
            "no Hugging Face architecture matches this Megatron-style model: "
            + (
                "model.mup scales its attention scores, embeddings and logits by its widths"
                if config.mup is not None
                else "model.position_embedding_multiplier scales its positions"
            )
            + " (transformers' decoders take no such multipliers)"
        )
    if config.num_unique_layers not in (None, config.num_layers):
        raise ModelConfigError(
            f"no Hugging Face architecture matches this Megatron-style model: its "
            f"{config.num_layers} layers share {config.num_unique_layers} layers' weights "
            "(num_unique_layers)"
        )
    other = sorted(set(config.attention_layers or ()) - {"dense"})
    if other:
        raise ModelConfigError(
            f"no Hugging Face architecture matches this Megatron-style model: model."
            f"attention_layers has {', '.join(other)} layers (transformers' GPT and Llama "
            "decoders attend densely in every layer)"
        )
    if config.transformer_block_type != "pre_ln" or (config.normalization == "layernorm" and not config.gated):
        return gpt_neox_mapping(config)
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
    if config.sliding_window is not None and (config.attention_has_bias or config.mlp_has_bias):
        mismatches.append("the linear layers have biases (Mistral, the sliding-window architecture, has none)")
    moe = config.moe
    if moe is not None:
        mismatches += [
            f"moe.{key} is {value!r} (Mixtral needs {needed!r})"
            for key, value, needed in (
                ("frequency", moe.frequency, 1),
                ("routing_algorithm", moe.routing, "top_k"),
                ("router_activation", moe.router_activation, "softmax"),
                ("normalize_top_k_affinities", moe.normalize_top_k_affinities, True),
                ("residual", moe.residual, False),
                ("has_bias", config.attention_has_bias or config.mlp_has_bias, False),
            )
            if value != needed
        ]
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
        "attention_bias": config.attention_has_bias,
        "mlp_bias": config.mlp_has_bias,
        "attention_dropout": 0.0,
        "tie_word_embeddings": config.share_embeddings_and_output_weights,
    }
    if mistral or moe is not None:
        hf_config["sliding_window"] = config.sliding_window
    if moe is not None:  # exported dropless: a capacity is a training-time limit
        hf_config.update(
            num_local_experts=moe.num_experts,
            num_experts_per_tok=moe.top_k,
            output_router_logits=moe.router_aux_loss,
            router_aux_loss_coef=moe.router_aux_loss_coef,
        )
        del hf_config["mlp_bias"]
    layer_keys = [
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    ]
    if moe is not None:
        layer_keys = [key for key in layer_keys if not key.startswith("mlp.")]
    layer_keys += [
        k.replace(".weight", ".bias")
        for k in layer_keys
        if (config.attention_has_bias and "self_attn" in k) or (config.mlp_has_bias and "mlp." in k)
    ]
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    names += [f"model.layers.{i}.{key}" for i in range(config.num_layers) for key in layer_keys]
    vocab_keys = ["model.embed_tokens.weight"]
    if not config.share_embeddings_and_output_weights:
        names.append("lm_head.weight")
        vocab_keys.append("lm_head.weight")
    tied = TIED_OUTPUT if config.share_embeddings_and_output_weights else {}
    experts, stacked = mixtral_keys(config.moe_layers, moe.num_experts) if moe is not None else ({}, {})
    return HFMapping(
        hf_config,
        {**{_ours(name, config): name for name in names}, **experts},
        config.vocab_size,
        tuple(vocab_keys),
        tied,
        stacked,
    )


GPT_NEOX_LAYER = {
    "input_layernorm.weight": "input_layernorm.weight",
    "input_layernorm.bias": "input_layernorm.bias",
    "post_attention_layernorm.weight": "post_attention_layernorm.weight",
    "post_attention_layernorm.bias": "post_attention_layernorm.bias",
    "self_attn.o_proj.weight": "attention.dense.weight",
    "self_attn.o_proj.bias": "attention.dense.bias",
    "mlp.up_proj.weight": "mlp.dense_h_to_4h.weight",
    "mlp.up_proj.bias": "mlp.dense_h_to_4h.bias",
    "mlp.down_proj.weight": "mlp.dense_4h_to_h.weight",
    "mlp.down_proj.bias": "mlp.dense_4h_to_h.bias",
}
"""Our decoder layer's keys -> GPTNeoXForCausalLM's, under model.layers.N / gpt_neox.layers.N."""


GPT_NEOX_BUFFERS = (".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq")
"""Buffers older transformers saved in GPT-NeoX checkpoints (Pythia's among them)."""


def gpt_neox_mapping(config: GPTConfig) -> HFMapping:
    """The GPTNeoXForCausalLM of a layernorm model with an ungated MLP and rotary positions."""
    mismatches = [
        f"{key} is {value!r} ({needed})"
        for key, value, needed in (
            ("transformer_block_type", config.transformer_block_type, "GPT-NeoX runs gpt_neox or pre_ln blocks"),
            ("normalization", config.normalization, "GPT-NeoX uses layernorm"),
            ("position_embedding_type", config.position_embedding_type, "GPT-NeoX uses rope"),
            ("activation", config.activation, f"GPT-NeoX's hidden_act takes {', '.join(sorted(HF_ACTIVATIONS))}"),
            ("num_kv_heads", config.kv_heads, "GPT-NeoX has as many key/value heads as query heads"),
            ("mlp_bias", config.mlp_has_bias, "GPT-NeoX's MLP always has biases"),
            ("sliding_window_size", config.sliding_window, "GPT-NeoX attends the whole sequence"),
            ("moe", config.moe, "GPT-NeoX has no experts"),
        )
        if not _gpt_neox_accepts(key, value, config)
    ]
    if config.position_embedding_type == "rope" and int(config.head_dim * config.rotary_percentage) % 2:
        mismatches.append(
            f"rotary_percentage {config.rotary_percentage} rotates an odd "
            f"{int(config.head_dim * config.rotary_percentage)} of {config.head_dim} dims (GPT-NeoX "
            f"needs an even count)"
        )
    if mismatches:
        raise ModelConfigError(
            "no Hugging Face architecture matches this Megatron-style model: " + "; ".join(mismatches)
        )
    hf_config = {
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.ffn_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_attention_heads,
        "hidden_act": HF_ACTIVATIONS[config.activation],
        "max_position_embeddings": config.max_positions,
        "initializer_range": config.init_method_std,
        "layer_norm_eps": config.layernorm_epsilon,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": config.rope_theta,
            "partial_rotary_factor": config.rotary_percentage,
        },
        "rotary_pct": config.rotary_percentage,  # the same, as transformers before 5 reads it
        "rotary_emb_base": config.rope_theta,
        "use_parallel_residual": config.transformer_block_type == "gpt_neox",
        "attention_bias": config.attention_has_bias,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "tie_word_embeddings": config.share_embeddings_and_output_weights,
    }
    keys = {
        "model.embed_tokens.weight": "gpt_neox.embed_in.weight",
        "model.norm.weight": "gpt_neox.final_layer_norm.weight",
        "model.norm.bias": "gpt_neox.final_layer_norm.bias",
    }
    interleaved = {}
    kinds = ("weight", "bias") if config.attention_has_bias else ("weight",)
    for index in range(config.num_layers):
        ours, theirs = f"model.layers.{index}.", f"gpt_neox.layers.{index}."
        keys.update(
            {
                ours + key: theirs + key_there
                for key, key_there in GPT_NEOX_LAYER.items()
                if config.attention_has_bias or not key.startswith("self_attn.o_proj.bias")
            }
        )
        for kind in kinds:
            parts = tuple(_ours(f"{ours}self_attn.{p}_proj.{kind}", config) for p in "qkv")
            interleaved[f"{theirs}attention.query_key_value.{kind}"] = (parts, config.head_dim)
    vocab_keys = ["model.embed_tokens.weight"]
    if not config.share_embeddings_and_output_weights:
        keys["lm_head.weight"] = "embed_out.weight"
        vocab_keys.append("lm_head.weight")
    tied = TIED_OUTPUT if config.share_embeddings_and_output_weights else {}
    return HFMapping(
        hf_config, keys, config.vocab_size, tuple(vocab_keys), tied, interleaved=interleaved, buffers=GPT_NEOX_BUFFERS
    )


def _gpt_neox_accepts(key: str, value: object, config: GPTConfig) -> bool:
    accepted = {
        "transformer_block_type": value in ("gpt_neox", "pre_ln"),
        "normalization": value == "layernorm",
        "position_embedding_type": value == "rope",
        "activation": value in HF_ACTIVATIONS,
        "num_kv_heads": value == config.num_attention_heads,
        "mlp_bias": bool(value),
        "sliding_window_size": value is None,
        "moe": value is None,
    }
    return accepted[key]


def hf_self_mapping(config: PretrainedConfig, names: list[str]) -> HFMapping:
    """A transformers model's own layout: every state-dict key (`names`) maps to itself, but for the
    QKV module's (qkv_linear), which map to the q/k/v layers they came from, and a Mixtral's MoE
    layers, which map to the hub's per-expert layout."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    content = {key: value for key, value in config.to_dict().items() if key not in (QKV_LINEAR, MOE_SPEC)}
    content["architectures"] = content.get("architectures") or [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    tied = TIED_OUTPUT if config.tie_word_embeddings else {}
    moe = moe_of(config)
    experts, stacked = ({}, {}) if moe is None else mixtral_keys(list(range(config.num_hidden_layers)), moe.num_experts)
    keys = {name: hf_key(name) for name in names if name not in tied and name not in stacked}
    return HFMapping(content, {**keys, **experts}, tied=tied, stacked=stacked)


def _ours(hf_name: str, config: GPTConfig) -> str:
    """Our key for a Llama key: identical, except the fused module's q/k/v parameters under qkv_linear."""
    for projection in ("q", "k", "v"):
        for kind in ("weight", "bias"):
            if config.qkv_linear and hf_name.endswith(f"self_attn.{projection}_proj.{kind}"):
                return hf_name.replace(f"{projection}_proj.{kind}", f"qkv_proj.{kind}_{projection}")
    return hf_name
