"""GPT-NeoX's model keys: the architecture, attention layout, NeoX's MLP width rule and its dropless MoE, as the
Megatron-style model's nxd keys."""

from __future__ import annotations

import math
from typing import Any

from ..errors import show
from ..schema.model import GATED_ACTIVATIONS as GATED
from .translation import Arguments, Translation, choice, typed

ATTENTION_KINDS = (
    "global",
    "local",
    "sparse_fixed",
    "sparse_variable",
    "bigbird",
    "bslongformer",
    "gmlp",
    "amlp",
    "flash",
    "rwkv",
    "mamba",
)
DENSE_ATTENTION = ("global", "flash")
SPARSE_ATTENTION = ("local", "sparse_fixed", "sparse_variable", "bigbird", "bslongformer")
GATING = ("gmlp", "amlp")
ACTIVATIONS = {
    "gelu": "gelu",
    "relu": "relu",
    "softsign": "softsign",
    "swish": "silu",
    "silu": "silu",
    "mish": "mish",
    "geglu": "geglu",
    "reglu": "reglu",
    "swiglu": "swiglu",
    "bilinear": "bilinear",
    "glu": "glu",
}
"""NeoX's activation names -> nxd's."""
NORMS = {
    "layernorm": ("layernorm", "layernorm_epsilon"),
    "rmsnorm": ("rmsnorm", "rms_norm_epsilon"),
    "scalenorm": ("scalenorm", "scalenorm_epsilon"),
    "non_parametric_layernorm": ("non_parametric_layernorm", "layernorm_epsilon"),
    "te_layernorm": ("layernorm", "layernorm_epsilon"),
    "te_rmsnorm": ("rmsnorm", "rms_norm_epsilon"),
}
"""Each NeoX norm: nxd's norm of the same arithmetic, and the key of its epsilon (megatron/model/norms.py)."""
POSITIONS = {
    "learned": "learned_absolute",
    "rotary": "rope",
    "sinusoidal": "sinusoidal",
    "alibi": "alibi",
    "rpe": "rpe",
    "none": "none",
}


def model_keys(a: Arguments, t: Translation) -> None:
    plain = {
        "num_layers": "model.num_layers",
        "hidden_size": "model.hidden_size",
        "num_attention_heads": "model.num_attention_heads",
        "num_kv_heads": "model.num_kv_heads",
        "seq_length": "model.encoder_seq_length",
        "max_position_embeddings": "model.max_position_embeddings",
        "init_method_std": "model.init_method_std",
        "make_vocab_size_divisible_by": "model.make_vocab_size_divisible_by",
        "apply_query_key_layer_scaling": "model.apply_query_key_layer_scaling",
        "use_cpu_initialization": "model.use_cpu_initialization",
        "hidden_dropout": "model.hidden_dropout",
        "attention_dropout": "model.attention_dropout",
        "init_method": "model.init_method",
        "output_layer_init_method": "model.output_layer_init_method",
        "use_bias_in_attn_linear": "model.attention_bias",
        "use_bias_in_mlp": "model.mlp_bias",
    }
    for key, path in plain.items():
        t.set(path, a[key], key)
    for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "max_position_embeddings"):
        if a[key] is None:
            t.refuse(key, "expected a value (GPT-NeoX requires it), found none")
    t.set("model.ffn_dropout", 0.0)
    t.set("model.share_embeddings_and_output_weights", not a["no_weight_tying"], "no_weight_tying")
    if (qk_norm := typed(t, a, "use_qk_layernorm", bool, "true or false")) is not None:
        t.set("model.qk_layernorm", qk_norm, "use_qk_layernorm")
    choice(t, a, "output_layer_parallelism", ("column",))  # over the vocabulary, as nxd's output layer is
    norm = choice(t, a, "norm", NORMS)
    if norm is not None:
        ours, epsilon = NORMS[norm]
        t.set("model.normalization", ours, "norm")
        t.set("model.layernorm_epsilon", a[epsilon], epsilon)
        if norm.startswith("te_"):
            t.notice(
                "norm", f"{norm}: Transformer Engine's kernel for {ours}; nxd computes the same {ours} with torch's"
            )
        if a["use_qk_layernorm"] is True and norm.startswith("te_"):
            t.refuse(
                "use_qk_layernorm",
                f"expected false with norm: {norm}, found true: Transformer Engine's norm "
                "takes one width, not NeoX's (heads, head_dim)",
            )
        tp = a["model_parallel_size"]
        if a["use_qk_layernorm"] is True and "layernorm" in norm and isinstance(tp, int) and tp > 1:
            t.notice(
                "use_qk_layernorm",
                f"with {norm} NeoX standardises each of its {tp} tensor-parallel ranks' "
                "heads apart, so its model changes with model_parallel_size; nxd standardises all heads of a "
                "token together, as NeoX does on one rank",
            )
        if norm == "non_parametric_layernorm" and a["layernorm_fusion"]:
            t.refuse(
                "layernorm_fusion",
                "expected false with norm: non_parametric_layernorm (GPT-NeoX refuses the two together), found true",
            )
    position = choice(t, a, "pos_emb", POSITIONS)
    if position is not None:
        t.set("model.position_embedding_type", POSITIONS[position], "pos_emb")
    if position == "learned" and a["use_bnb_optimizer"] is True:  # NeoX's Embedding: bitsandbytes' StableEmbedding
        t.set("model.position_embedding_norm", True, "use_bnb_optimizer", "pos_emb")
    if position == "rpe":
        t.set("model.rpe_num_buckets", a["rpe_num_buckets"], "rpe_num_buckets")
        t.set("model.rpe_max_distance", a["rpe_max_distance"], "rpe_max_distance")
    for key in ("rpe_num_buckets", "rpe_max_distance"):
        if position != "rpe" and a.given(key):
            t.notice(key, f"accepted, changes nothing here: pos_emb is {a['pos_emb']!r}, not rpe")
    offset = typed(t, a, "opt_pos_emb_offset", int, "a whole number of positions")
    if offset:  # the learned table's rows only: NeoX's sinusoids are taken at 0 .. seq - 1 whatever the ids
        if position == "learned":
            t.set("model.position_embedding_offset", offset, "opt_pos_emb_offset")
        else:
            t.notice(
                "opt_pos_emb_offset",
                f"accepted, changes nothing here: pos_emb is {a['pos_emb']!r}; NeoX shifts learned positions only",
            )
    fraction, base = a["rotary_pct"], a["rotary_emb_base"]
    if position == "rotary":
        t.set("model.rotary_percentage", fraction, "rotary_pct")
        t.set("model.rope_theta", base, "rotary_emb_base")
    elif a.given("rotary_pct") or a.given("rotary_emb_base"):
        t.notice("rotary_pct", f"accepted, changes nothing here: pos_emb is {a['pos_emb']!r}, not rotary")
    residual, tied = a["gpt_j_residual"], a["gpt_j_tied"]
    t.set(
        "model.transformer_block_type",
        ("gpt_j" if tied else "gpt_neox") if residual else "pre_ln",
        "gpt_j_residual",
        "gpt_j_tied",
    )
    if tied and not residual:
        t.notice("gpt_j_tied", "accepted, changes nothing here: it ties the norms of gpt_j_residual blocks only")
    window, seq = typed(t, a, "sliding_window_width", int, "a whole number of tokens"), a["seq_length"]
    if window is not None:  # a window as long as the sequence is full causal attention, as in NeoX
        t.set(
            "model.sliding_window_size",
            min(window + 1, seq) if isinstance(seq, int) else window + 1,
            "sliding_window_width",
        )
    if position in ("alibi", "rpe") and a["apply_query_key_layer_scaling"] is True:
        t.refuse(
            "apply_query_key_layer_scaling",
            f"expected false with pos_emb: {position}, found true: NeoX's "
            f"global layers then scale the {position} bias by the layer number (its flash layers do not); nxd "
            "adds it to the scaled scores unscaled",
        )


SOFT_PROMPT_KEYS = {
    "enabled": "enabled",
    "n_tokens": "n_tokens",
    "num_tokens": "n_tokens",
    "init_string": "init_string",
    "init_range": "init_range",
}
"""soft_prompt_tuning's entries: NeoX's code reads n_tokens, its reference names num_tokens."""


def soft_prompt_keys(a: Arguments, t: Translation) -> None:
    """soft_prompt_tuning (megatron/training.py: only with enabled true) as model.soft_prompt."""
    config = a["soft_prompt_tuning"]
    if config in (None, {}):
        return
    if not isinstance(config, dict):
        t.refuse(
            "soft_prompt_tuning", f"expected a mapping such as {{enabled: true, n_tokens: 10}}, found {show(config)}"
        )
        return
    unknown = sorted(set(config) - set(SOFT_PROMPT_KEYS))
    if unknown:
        t.refuse(
            f"soft_prompt_tuning.{unknown[0]}",
            f"expected entries among {', '.join(SOFT_PROMPT_KEYS)}, found {', '.join(unknown)}",
        )
        return
    if "n_tokens" in config and "num_tokens" in config and config["n_tokens"] != config["num_tokens"]:
        t.refuse(
            "soft_prompt_tuning.num_tokens",
            f"expected one prompt length, found n_tokens {config['n_tokens']} and num_tokens {config['num_tokens']}",
        )
        return
    if config.get("enabled", False) is not True:
        t.notice("soft_prompt_tuning", "accepted, changes nothing here: NeoX prompt-tunes only with enabled: true")
        return
    t.set(
        "model.soft_prompt",
        {SOFT_PROMPT_KEYS[name]: value for name, value in config.items() if name != "enabled"},
        "soft_prompt_tuning",
    )


MUP_KEYS = {
    "base_shapes_file": "base_shapes_file",
    "save_base_shapes": "save_base_shapes",
    "mup_width_scale": "width_scale",
    "mup_init_scale": "init_scale",
    "mup_attn_temp": "attention_temperature",
    "mup_output_temp": "output_temperature",
    "mup_embedding_mult": "embedding_multiplier",
    "coord_check": "coord_check",
}
"""NeoX's muP keys -> model.mup's."""


def mup_keys(a: Arguments, t: Translation) -> None:
    """use_mup and its keys (megatron/training.py, word_embeddings.py, transformer.py) as model.mup;
    mup_rp_embedding_mult scales the position embeddings with or without muP, as NeoX's embedding does."""
    if a.given("mup_rp_embedding_mult"):
        t.set("model.position_embedding_multiplier", a["mup_rp_embedding_mult"], "mup_rp_embedding_mult")
    if not typed(t, a, "use_mup", bool, "true or false"):
        for key in MUP_KEYS:
            if a.given(key):
                t.notice(key, "accepted, changes nothing here: NeoX reads it only with use_mup: true")
        return
    t.set(
        "model.mup",
        {ours: a[key] for key, ours in MUP_KEYS.items() if a.given(key) or key == "base_shapes_file"},
        "use_mup",
        *(key for key in MUP_KEYS if a.given(key)),
    )


def sharing_keys(a: Arguments, t: Translation) -> None:
    """num_unique_layers and param_sharing_style (Megatron's parameter sharing)."""
    unique = typed(t, a, "num_unique_layers", int, "a whole number of layers")
    style = choice(t, a, "param_sharing_style", ("grouped", "spaced"))
    if unique is None:
        if a.given("param_sharing_style"):
            t.notice(
                "param_sharing_style",
                "accepted, changes nothing here: it orders the layers num_unique_layers shares, and the file sets none",
            )
        return
    t.set("model.num_unique_layers", unique, "num_unique_layers")
    if style is not None:
        t.set("model.param_sharing_style", style, "param_sharing_style")


def attention_keys(a: Arguments, t: Translation) -> None:
    """attention_config's kinds as model.attention_layers (global and flash are both dense causal attention;
    NeoX's sparse kinds are DeepSpeed's block layouts, set by sparsity_config)."""
    layers = a["num_layers"]
    kinds = expand_attention_config(t, a["attention_config"], layers if isinstance(layers, int) else None)
    if kinds is None:
        return
    other = sorted(set(kinds) - set(DENSE_ATTENTION) - set(SPARSE_ATTENTION) - set(GATING) - {"mamba", "rwkv"})
    if other:
        t.refuse(
            "attention_config",
            f"expected global, flash, {', '.join(SPARSE_ATTENTION)}, gmlp, amlp, mamba or "
            f"rwkv layers, found {', '.join(other)}: nxd has no {', '.join(other)} layers",
        )
    t.set("model.fusions.flash_attention", True, "attention_config")
    sparse = sorted(set(kinds) & set(SPARSE_ATTENTION))
    gating = sorted(set(kinds) & set(GATING))
    if sparse or gating or {"mamba", "rwkv"} & set(kinds):
        t.set(
            "model.attention_layers",
            ["dense" if kind in DENSE_ATTENTION else kind for kind in kinds],
            "attention_config",
        )
    if sparse and a["pos_emb"] == "alibi":
        t.refuse(
            "attention_config",
            f"expected global or flash layers with pos_emb: alibi, found "
            f"{', '.join(sparse)}: NeoX's sparse layers add no ALiBi bias, nxd's would",
        )
    gating_keys(a, t, gating)
    mamba_keys(a, t, "mamba" in kinds)
    rwkv_keys(a, t, "rwkv" in kinds)
    sparsity_keys(a, t, bool(sparse))


def rwkv_keys(a: Arguments, t: Translation, used: bool) -> None:
    """dim_att, head_size and ffn_dim of rwkv layers (NeoX's RWKVResidualLayer: head_size is dim_att / heads; the
    channel mix is intermediate_size, else expansion_factor (3.5) x hidden_size, rounded down to a multiple of 32,
    unless ffn_dim says)."""
    if not used:
        for key in ("dim_att", "head_size", "ffn_dim"):
            if a[key] is not None:
                t.notice(
                    key, "accepted, changes nothing here: only rwkv layers read it, and attention_config names none"
                )
        return
    hidden, heads = a["hidden_size"], a["num_attention_heads"]
    width = typed(t, a, "dim_att", int, "a whole number") or hidden
    if a["dim_att"] is not None:
        t.set("model.rwkv_dim_att", width, "dim_att")
    if (
        a["head_size"] is not None
        and isinstance(width, int)
        and isinstance(heads, int)
        and heads
        and a["head_size"] != width // heads
    ):
        t.refuse(
            "head_size",
            f"expected dim_att / num_attention_heads ({width // heads}), as NeoX computes it, "
            f"found {show(a['head_size'])}",
        )
    size, factor = a["intermediate_size"], a["expansion_factor"]  # both given: refused by mlp_keys
    if a["ffn_dim"] is not None:
        t.set("model.rwkv_ffn_size", typed(t, a, "ffn_dim", int, "a whole number"), "ffn_dim")
    elif size is not None or factor is not None and isinstance(hidden, int):
        t.set(
            "model.rwkv_ffn_size",
            int(size if size is not None else factor * hidden) // 32 * 32,
            "intermediate_size",
            "expansion_factor",
        )


def mamba_keys(a: Arguments, t: Translation, used: bool) -> None:
    """The mamba layers' biases, and their width: intermediate_size, else expansion_factor x hidden_size, else
    2 x hidden_size (NeoX's ParallelMambaBlock)."""
    for key, path in (
        ("mamba_use_bias_in_conv", "model.mamba_conv_bias"),
        ("mamba_use_bias_in_linears", "model.mamba_linear_bias"),
    ):
        if used:
            t.set(path, typed(t, a, key, bool, "true or false"), key)
        elif a.given(key):
            t.notice(key, "accepted, changes nothing here: only mamba layers read it, and attention_config names none")
    hidden, size, factor = a["hidden_size"], a["intermediate_size"], a["expansion_factor"]
    if used and size is not None:  # both given: refused by mlp_keys
        t.set("model.mamba_inner_size", size, "intermediate_size")
    elif used and isinstance(factor, int | float) and isinstance(hidden, int):
        t.set("model.mamba_inner_size", int(factor * hidden), "expansion_factor", "hidden_size")


def gating_keys(a: Arguments, t: Translation, gating: list[str]) -> None:
    """gmlp_attn_dim, read by amlp layers; and a notice that nxd's gMLP layers do not depend on the split."""
    if "amlp" in gating:
        t.set("model.gmlp_attention_dim", a["gmlp_attn_dim"], "gmlp_attn_dim")
    elif a.given("gmlp_attn_dim"):
        t.notice(
            "gmlp_attn_dim", "accepted, changes nothing here: only amlp layers read it, and attention_config names none"
        )
    if gating and isinstance(a["model_parallel_size"], int) and a["model_parallel_size"] > 1:
        t.notice(
            "attention_config",
            f"{', '.join(gating)} layers are whole on every tensor-parallel rank in nxd: "
            "NeoX's GMLPBlock normalises, gates and attends over each rank's slice of the inner width, so "
            "its model changes with model_parallel_size; nxd computes the single-process model",
        )


def deepspeed_moe_keys(a: Arguments, t: Translation, experts: int, interval_key: str) -> None:
    """Older NeoX's moe_type: deepspeed (DeepSpeed's MoE layer with NeoX's MLP as the expert): DeepSpeed's gate,
    capacity only with moe_token_dropping, PR-MoE with moe_use_residual, and moe_loss_coeff times the layers' summed
    load-balancing losses (nxd averages over layers, so the coefficient is multiplied by their number). The experts
    have the dense MLP's width."""
    for key in ("moe_router_type", "moe_jitter_eps"):
        if a.given(key):
            t.notice(
                key,
                "accepted, changes nothing here: DeepSpeed's gate routes with moe_type: deepspeed (this key "
                "is read by NeoX's own MoE)",
            )
    dropping = typed(t, a, "moe_token_dropping", bool, "true or false")
    coefficient = typed(t, a, "moe_loss_coeff", float, "a number")
    layers = a["num_layers"] if isinstance(a["num_layers"], int) else 1
    moe = {
        "num_experts": experts,
        "top_k": a["moe_top_k"],
        "frequency": 1,
        "routing_algorithm": "deepspeed",
        "dropless": not dropping,
        "residual": typed(t, a, "moe_use_residual", bool, "true or false"),
        "glu": typed(t, a, "moe_glu", bool, "true or false"),
        "output_router_logits": True,
        "router_aux_loss_coef": (coefficient or 0.0) * layers,
    }
    if dropping:
        moe.update(
            capacity_factor=a["moe_train_capacity_factor"],
            eval_capacity_factor=a["moe_eval_capacity_factor"],
            min_capacity=a["moe_min_capacity"],
        )
    else:
        for key in ("moe_train_capacity_factor", "moe_eval_capacity_factor", "moe_min_capacity"):
            if a.given(key):
                t.notice(
                    key,
                    "accepted, changes nothing here: read only with moe_token_dropping true (DeepSpeed keeps "
                    "every token without it)",
                )
    t.set("model.moe", moe, "moe_type", "moe_num_experts", "moe_top_k", *DEEPSPEED_MOE_KEYS)
    for part, key in (
        ("num_experts", "moe_num_experts"),
        ("top_k", "moe_top_k"),
        ("frequency", interval_key),
        ("residual", "moe_use_residual"),
        ("glu", "moe_glu"),
        ("dropless", "moe_token_dropping"),
        ("router_aux_loss_coef", "moe_loss_coeff"),
        ("capacity_factor", "moe_train_capacity_factor"),
        ("eval_capacity_factor", "moe_eval_capacity_factor"),
        ("min_capacity", "moe_min_capacity"),
    ):
        t.claim(f"model.moe.{part}", key)
    if a["moe_top_k"] not in (1, 2):
        t.refuse(
            "moe_top_k",
            f"expected 1 or 2 with moe_type: deepspeed (DeepSpeed's top1gating and top2gating), "
            f"found {show(a['moe_top_k'])}",
        )


SPARSITY_KEYS = (
    "block",
    "different_layout_per_head",
    "num_local_blocks",
    "num_global_blocks",
    "num_different_global_patterns",
    "num_random_blocks",
    "local_window_blocks",
    "global_block_indices",
    "global_block_end_indices",
    "num_sliding_window_blocks",
)
"""The sparsity_config entries NeoX reads (megatron/model/utils.py: configure_sparse_attention)."""
SPARSITY_FIXED = {
    "mode": "attention_config sets each layer's kind",
    "attention": "NeoX's layers are always unidirectional",
    "horizontal_global_attention": "NeoX passes false (unidirectional layers)",
}
"""Entries of DeepSpeed's sparse_attention block NeoX accepts and overrides."""


def sparsity_keys(a: Arguments, t: Translation, used: bool) -> None:
    config = a["sparsity_config"]
    if config in (None, {}):
        return
    if not isinstance(config, dict):
        t.refuse("sparsity_config", f"expected a mapping of DeepSpeed's sparsity settings, found {show(config)}")
        return
    if not used:
        t.notice("sparsity_config", "accepted, changes nothing here: attention_config names no sparse layer")
        return
    for name, value in config.items():
        if name in SPARSITY_FIXED:
            t.notice(f"sparsity_config.{name}", f"accepted, changes nothing here: {SPARSITY_FIXED[name]}")
        elif name not in SPARSITY_KEYS:
            t.refuse(
                f"sparsity_config.{name}",
                f"expected one of {', '.join(SPARSITY_KEYS)} (what NeoX reads), found {name!r}",
            )
        else:
            t.set(f"model.sparse_attention.{name}", value, "sparsity_config")


def expand_attention_config(t: Translation, config: Any, layers: int | None) -> list[str] | None:
    """NeoX's attention_config expanded to one kind per layer (megatron/utils.py: expand_attention_types):
    [[kinds, n], ...] repeats each list n times; n "all" fills every layer with that pattern at once."""
    if config is None:
        return ["global"] * (layers or 0)
    key = "attention_config"
    if not isinstance(config, list):
        t.refuse(key, f'expected a list such as [[["global"], num_layers]], found {show(config)}')
        return None
    if all(isinstance(item, str) for item in config):
        kinds = list(config)
    else:
        kinds = []
        for item in config:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], list)):
                t.refuse(key, f"expected items [[kinds ...], count], found {show(item)}")
                return None
            pattern, count = item
            if count == "all":
                if layers is None or layers % len(pattern):
                    t.refuse(
                        key,
                        f"expected a pattern whose length divides num_layers ({layers}) with 'all', "
                        f"found {len(pattern)} kinds",
                    )
                    return None
                kinds = pattern * (layers // len(pattern))
                break
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                t.refuse(key, f"expected a count (a whole number or 'all') in {show(item)}, found {show(count)}")
                return None
            kinds += pattern * count
    unknown = sorted({str(kind) for kind in kinds} - set(ATTENTION_KINDS))
    if unknown:
        t.refuse(key, f"expected attention kinds among {', '.join(ATTENTION_KINDS)}, found {', '.join(unknown)}")
        return None
    if layers is not None and len(kinds) != layers:
        t.refuse(key, f"expected one kind per layer (num_layers: {layers}), found {len(kinds)} after expansion")
        return None
    return kinds


def mlp_keys(a: Arguments, t: Translation) -> None:
    """The activation and NeoX's MLP width rule (megatron/model/transformer.py: ParallelMLP): the first linear is
    `intermediate_size` wide (else expansion_factor x hidden, else 4 x hidden), two thirds of that for gated
    activations, split into up and gate; its width is rounded to 2 x mlp_multiple_of, the second linear's input
    to mlp_multiple_of. Widths that do not then agree are refused (NeoX crashes on them)."""
    name = choice(t, a, "activation", ACTIVATIONS)
    old_style = a["mlp_type"] if "mlp_type" in a.values else None  # only older NeoX files write it
    if old_style is not None:
        old_mlp(a, t, name, old_style)
        return
    if name is not None:
        activation = ACTIVATIONS[name]
        if activation == "gelu" and a["bias_gelu_fusion"]:
            if a["onnx_safe"]:
                t.refuse(
                    "bias_gelu_fusion", "expected false with onnx_safe (GPT-NeoX refuses the two together), found true"
                )
            activation = "approx-gelu"
        t.set("model.activation", activation, "activation", "bias_gelu_fusion")
    hidden = typed(t, a, "hidden_size", int, "a whole number")
    size = typed(t, a, "intermediate_size", int, "a whole number")
    factor = typed(t, a, "expansion_factor", (int, float), "a number")
    multiple = typed(t, a, "mlp_multiple_of", int, "a whole number")
    if size is not None and factor is not None:
        t.refuse(
            "intermediate_size", f"expected intermediate_size or expansion_factor, found both ({size} and {factor})"
        )
        return
    if multiple is not None and multiple < 1:
        t.refuse("mlp_multiple_of", f"expected a whole number of at least 1, found {multiple}")
        return
    if hidden is None or multiple is None or name is None:
        return
    width = size or (int(factor * hidden) if factor is not None else 4 * hidden)
    first, second = width, width
    if name in GATED:
        first = int(width * 2 / 3)
        second = first // 2
    first = 2 * multiple * math.ceil(first / (2 * multiple))
    second = multiple * math.ceil(second / multiple)
    needed = 2 * second if name in GATED else second
    if first != needed:
        given = f"intermediate_size {size}" if size else f"expansion_factor {factor}" if factor else "4 x hidden_size"
        t.refuse(
            "intermediate_size",
            f"{given} with mlp_multiple_of {multiple} gives the first MLP linear {first} "
            f"outputs and the second {second} inputs; expected {'twice ' if name in GATED else ''}the second's "
            f"(GPT-NeoX fails on these shapes: set mlp_multiple_of, or an intermediate_size that rounds "
            f"evenly)",
        )
        return
    t.set("model.ffn_hidden_size", second, "intermediate_size", "expansion_factor", "mlp_multiple_of")


def old_mlp(a: Arguments, t: Translation, name: str | None, style: Any) -> None:
    """`mlp_type` of NeoX before its MLP rework: regular (4 x hidden; a gated activation 2 x hidden per branch;
    gelu's tanh form with bias_gelu_fusion) or llama (bias-free, gated by the activation, intermediate_size as is
    or 256 x ceil(8 hidden / 3 / 256)). The width keys of the rework are refused beside it."""
    hidden, size = a["hidden_size"], typed(t, a, "intermediate_size", int, "a whole number")
    newer = [
        key
        for key in ("expansion_factor", "mlp_multiple_of") + (("intermediate_size",) if style == "regular" else ())
        if a.given(key)
    ]
    for key in newer:
        t.refuse(key, f"expected no {key} with mlp_type: {style} (GPT-NeoX's MLP before its rework had none)")
    if style not in ("regular", "llama"):
        t.refuse("mlp_type", f"expected regular or llama, found {show(style)}")
    if style not in ("regular", "llama") or not isinstance(hidden, int) or name is None or newer:
        return
    t.notice("mlp_type", "read as GPT-NeoX read it before its MLP rework (current NeoX removed the key)")
    if style == "regular":
        activation = "approx-gelu" if name == "gelu" and a["bias_gelu_fusion"] else ACTIVATIONS[name]
        t.set("model.activation", activation, "activation", "bias_gelu_fusion", "mlp_type")
        t.set("model.ffn_hidden_size", 2 * hidden if name in GATED else 4 * hidden, "mlp_type")
        return
    gated = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "relu": "reglu"}.get(name)
    if gated is None:
        t.refuse("activation", f"expected silu, swish, gelu or relu with mlp_type: llama, found {show(name)}")
        return
    t.set("model.activation", gated, "activation", "mlp_type")
    t.set("model.ffn_hidden_size", size or 256 * math.ceil(int(8 * hidden / 3) / 256), "intermediate_size", "mlp_type")
    t.set("model.mlp_bias", False, "mlp_type")


DEEPSPEED_MOE_KEYS = (
    "moe_loss_coeff",
    "moe_train_capacity_factor",
    "moe_eval_capacity_factor",
    "moe_min_capacity",
    "moe_token_dropping",
    "moe_use_residual",
    "moe_glu",
)
"""The keys of older NeoX's DeepSpeed MoE (moe_type: deepspeed)."""


def moe_keys(a: Arguments, t: Translation) -> None:
    """NeoX's dropless MoE (megatron/model/moe.py): top-k routing with softmax affinities, or its Sinkhorn router
    (megatron/model/router.py), not renormalised, no load-balancing loss, ungated experts of intermediate_size
    (else 256 x ceil(4 hidden / 256)); or, with moe_type: deepspeed, older NeoX's DeepSpeed MoE
    (`deepspeed_moe_keys`)."""
    experts = typed(t, a, "moe_num_experts", int, "a whole number")
    top_k, router = a["moe_top_k"], a["moe_router_type"]
    interval_key = (
        "expert_interval"
        if "expert_interval" in a.values and "moe_expert_interval" not in a.values
        else "moe_expert_interval"
    )
    interval = a[interval_key] if interval_key in a.values else 1
    t.set("distributed_strategy.expert_model_parallel_size", a["moe_expert_parallel_size"], "moe_expert_parallel_size")
    moe_type = choice(t, a, "moe_type", ("megablocks", "deepspeed"))
    deepspeed = moe_type == "deepspeed"
    if experts is None or experts <= 1:
        for key in ("moe_jitter_eps", "moe_type", *DEEPSPEED_MOE_KEYS):
            if a.given(key):
                t.notice(key, "accepted, changes nothing here: moe_num_experts makes no MoE layer")
        return
    if interval != 1:
        t.refuse(
            interval_key,
            f"expected 1 (MoE in every layer), found {show(interval)}: NeoX counts MoE "
            f"layers from 0 (0, n, 2n ...), nxd from 1 (n, 2n ...)",
        )
    if deepspeed:
        deepspeed_moe_keys(a, t, experts, interval_key)
        return
    for key in DEEPSPEED_MOE_KEYS:
        if key == "moe_token_dropping" and a[key] is True:
            t.refuse(
                key,
                "expected false with moe_type: megablocks (nxd follows NeoX's dropless megablocks MoE); "
                "moe_type: deepspeed drops tokens over capacity",
            )
        elif a.given(key):
            t.notice(key, "accepted, changes nothing here: read only by moe_type: deepspeed")
    if router not in ("topk", "sinkhorn"):
        t.refuse("moe_router_type", f"expected topk or sinkhorn, found {show(router)}")
    if a["activation"] in GATED:
        t.refuse(
            "activation",
            f"expected an ungated activation with moe_num_experts, found {a['activation']!r}: "
            f"GPT-NeoX's experts apply it without the gate",
        )
    hidden, size = a["hidden_size"], a["intermediate_size"]
    if isinstance(hidden, int):
        t.set(
            "model.ffn_hidden_size", size or 256 * math.ceil(4 * hidden / 256), "intermediate_size", "moe_num_experts"
        )
    sinkhorn = router == "sinkhorn"  # NeoX's SinkhornRouter: sigmoid affinities for top-1, softmax for more
    t.set(
        "model.moe",
        {
            "num_experts": experts,
            "top_k": top_k,
            "frequency": 1,
            "dropless": True,
            "routing_algorithm": "neox_sinkhorn" if sinkhorn else "top_k",
            "router_activation": "sigmoid" if sinkhorn and top_k == 1 else "softmax",
            "normalize_top_k_affinities": False,
        },
        "moe_num_experts",
        "moe_top_k",
        "moe_router_type",
    )
    for part, key in (("num_experts", "moe_num_experts"), ("top_k", "moe_top_k"), ("frequency", interval_key)):
        t.claim(f"model.moe.{part}", key)
    if a["moe_jitter_eps"] is not None and sinkhorn:
        t.notice(
            "moe_jitter_eps",
            "accepted, changes nothing here: GPT-NeoX's Sinkhorn router does not jitter (its top-k router does)",
        )
    elif a["moe_jitter_eps"] is not None:
        t.set("model.moe.jitter_eps", typed(t, a, "moe_jitter_eps", float, "a fraction"), "moe_jitter_eps")
