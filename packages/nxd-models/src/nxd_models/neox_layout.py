"""Where each weight of a Megatron-style model lives in a GPT-NeoX checkpoint, declared as data for nxd-ckpt.

GPT-NeoX builds its model as a sequence of layers (megatron/model/gpt2_model.py: GPT2ModelPipe): 0 the
embedding, 1 a step without weights, 2 ... L+1 the decoder layers, L+2 another, L+3 the final norm and L+4
the untied output layer. Each tensor-parallel rank saves its part of every layer: column-parallel weights
split by rows (query_key_value per rank: head by head [q k v] with as many key/value heads as query heads,
else [all q | all k | all v]; linear1 per rank: [up | gate] for gated activations), row-parallel weights by
columns, and the rest whole on every rank. A row-parallel bias is added on every rank before the sum in
NeoX's parallel (gpt_j_residual) blocks, so there the ranks' parts add up to ours; elsewhere it is added
once, and every rank holds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ModelConfigError
from .gpt import GPTConfig
from .layer_kinds import kinds_of, layer_kinds, names_list


@dataclass(frozen=True)
class NeoXSource:
    layer: int
    """Index of the layer in GPT-NeoX's sequence."""
    name: str
    """The tensor's name within that layer."""
    join: str
    """How the tensor-parallel ranks' parts make ours: "rows" or "columns" (concatenated), "sum", or "one" (every
    rank holds it whole)."""
    part: str | None = None
    """Ours is one part of each rank's tensor: "q", "k", "v" of query_key_value, "up" or "gate" of linear1."""


@dataclass(frozen=True)
class NeoXLayout:
    sources: dict[str, NeoXSource]
    """Our state-dict key -> where it is in a GPT-NeoX checkpoint."""
    heads: int
    kv_heads: int
    head_dim: int
    vocab_padded_keys: tuple[str, ...] = ()
    """Our keys whose rows are the padded vocabulary (NeoX pads to its own multiple)."""


def neox_layout(config: GPTConfig) -> NeoXLayout:
    """The GPT-NeoX checkpoint layout of `config`'s model; ModelConfigError for what NeoX's model cannot hold."""
    if config.moe is not None:
        raise ModelConfigError(
            "a GPT-NeoX checkpoint of a mixture of experts is not read by nxd (its megablocks "
            "experts have a layout of their own)"
        )
    if config.qk_layernorm:
        raise ModelConfigError(
            "a GPT-NeoX checkpoint with use_qk_layernorm is not read or written by nxd yet (its "
            "norm is split over the tensor-parallel ranks' heads)"
        )
    if config.position_embedding_type == "rpe":
        raise ModelConfigError(
            "a GPT-NeoX checkpoint of an rpe model keeps a copy of the bucket table in every "
            "layer (each pipeline stage trains its own); nxd does not read or write one"
        )
    if any(not kind.has_neox_layout for kind in kinds_of(config)):
        unread = names_list([kind.name for kind in layer_kinds() if not kind.has_neox_layout])
        raise ModelConfigError(
            f"a GPT-NeoX checkpoint of {unread} layers is not read or written by nxd yet: its checkpoint layout "
            "covers NeoX's transformer layers"
        )
    if config.num_unique_layers not in (None, config.num_layers):
        raise ModelConfigError(
            "a GPT-NeoX checkpoint holds every layer's own weights; nxd does not read or write one "
            "of a model whose layers share them (num_unique_layers)"
        )
    layers, parallel = config.num_layers, config.transformer_block_type != "pre_ln"
    norm_names = {
        "layernorm": ("weight", "bias"),
        "rmsnorm": ("scale",),
        "scalenorm": ("g",),
        "non_parametric_layernorm": (),
    }[config.normalization]
    ours_of = {"weight": "weight", "bias": "bias", "scale": "weight", "g": "weight"}
    sources = {"model.embed_tokens.weight": NeoXSource(0, "word_embeddings.weight", "rows")}
    if config.position_embedding_type == "learned_absolute":
        sources["model.position_embeddings.weight"] = NeoXSource(0, "position_embeddings.weight", "one")
        if config.position_embedding_norm:  # bitsandbytes' StableEmbedding: its LayerNorm under the table's name
            for name in ("weight", "bias"):
                sources[f"model.position_embeddings.norm.{name}"] = NeoXSource(
                    0, f"position_embeddings.norm.{name}", "one"
                )
    row_bias = "sum" if parallel else "one"
    for index in range(layers):
        ours, at = f"model.layers.{index}.", index + 2
        norms = ["input_layernorm"] + ([] if config.transformer_block_type == "gpt_j" else ["post_attention_layernorm"])
        for norm in norms:
            for name in norm_names:
                sources[f"{ours}{norm}.{ours_of[name]}"] = NeoXSource(at, f"{norm}.{name}", "one")
        kinds = ("weight", "bias") if config.attention_has_bias else ("weight",)
        for kind in kinds:
            for part in "qkv":
                key = (
                    f"{ours}self_attn.qkv_proj.{kind}_{part}"
                    if config.qkv_linear
                    else f"{ours}self_attn.{part}_proj.{kind}"
                )
                sources[key] = NeoXSource(at, f"attention.query_key_value.{kind}", "rows", part)
        sources[f"{ours}self_attn.o_proj.weight"] = NeoXSource(at, "attention.dense.weight", "columns")
        if config.attention_has_bias:
            sources[f"{ours}self_attn.o_proj.bias"] = NeoXSource(at, "attention.dense.bias", row_bias)
        for kind in ("weight", "bias") if config.mlp_has_bias else ("weight",):
            if config.gated:
                for part in ("up", "gate"):
                    sources[f"{ours}mlp.{part}_proj.{kind}"] = NeoXSource(at, f"mlp.linear1.{kind}", "rows", part)
            else:
                sources[f"{ours}mlp.up_proj.{kind}"] = NeoXSource(at, f"mlp.linear1.{kind}", "rows")
        sources[f"{ours}mlp.down_proj.weight"] = NeoXSource(at, "mlp.linear2.weight", "columns")
        if config.mlp_has_bias:
            sources[f"{ours}mlp.down_proj.bias"] = NeoXSource(at, "mlp.linear2.bias", row_bias)
    for name in norm_names:
        sources[f"model.norm.{ours_of[name]}"] = NeoXSource(layers + 3, f"norm.{name}", "one")
    vocab = ["model.embed_tokens.weight"]
    if not config.share_embeddings_and_output_weights:
        sources["lm_head.weight"] = NeoXSource(layers + 4, "final_linear.weight", "rows")
        vocab.append("lm_head.weight")
    return NeoXLayout(sources, config.num_attention_heads, config.kv_heads, config.head_dim, tuple(vocab))
