"""The model: where the architecture comes from, positions over the sequence, what this release builds, soft
prompts, muP and sliding windows."""

from __future__ import annotations

from collections.abc import Iterator

from ..schema import NxdConfig
from ..schema.alignment import METHODS
from .findings import ALIGN, BLOCK_TYPES, CP, MEGATRON_ONLY, PP, SEQ, SP, TP, Finding, error, notice
from .layers import attention_layers


def model_source_keys(c: NxdConfig) -> Iterator[Finding]:
    m = c.model
    if c.model_source == "hf":
        if m.hf_model_config is None:
            yield error(
                "model.model_config",
                "expected the path of a Hugging Face config.json (model_source is hf), found nothing",
                "model.model_config",
                "model_source",
            )
        for name in MEGATRON_ONLY:
            if m.is_set(name):
                yield error(
                    f"model.{name}",
                    "expected no value: this key describes a Megatron-style architecture and "
                    "model_source is hf, whose architecture comes from model.model_config",
                    f"model.{name}",
                    "model_source",
                )
        return
    if m.hf_model_config is not None:
        yield error(
            "model.model_config",
            "expected no value with model_source: megatron (set model_source: hf to build a Hugging Face architecture)",
            "model.model_config",
            "model_source",
        )
    for name in ("num_layers", "hidden_size", "num_attention_heads"):
        if getattr(m, name) is None:
            yield error(f"model.{name}", "expected a value (required for model_source: megatron)", f"model.{name}")
    if m.kv_channels is None and m.hidden_size and m.num_attention_heads and m.hidden_size % m.num_attention_heads:
        yield error(
            "model.hidden_size",
            f"expected a multiple of num_attention_heads ({m.num_attention_heads}) when kv_channels "
            f"is null, found {m.hidden_size}",
            "model.hidden_size",
            "model.num_attention_heads",
            "model.kv_channels",
        )


def sequence_length_required(c: NxdConfig) -> Iterator[Finding]:
    if c.model.encoder_seq_length is None:
        yield error("model.encoder_seq_length", "expected the training sequence length, found nothing")


def positions_cover_sequence(c: NxdConfig) -> Iterator[Finding]:
    m, offset = c.model, c.model.position_embedding_offset
    if c.model_source != "megatron":
        return
    if offset and m.position_embedding_type not in ("learned_absolute", "sinusoidal"):
        yield error(
            "model.position_embedding_offset",
            f"shifts the learned_absolute or sinusoidal positions; expected "
            f"0 with {m.position_embedding_type} positions, found {offset}",
            "model.position_embedding_offset",
            "model.position_embedding_type",
        )
    if m.position_embedding_norm and m.position_embedding_type != "learned_absolute":
        yield error(
            "model.position_embedding_norm",
            f"normalises the learned position table's rows; expected "
            f"position_embedding_type learned_absolute with it, found {m.position_embedding_type}",
            "model.position_embedding_norm",
            "model.position_embedding_type",
        )
    if m.position_embedding_multiplier != 1 and m.position_embedding_type not in ("learned_absolute", "sinusoidal"):
        yield notice(
            "model.position_embedding_multiplier",
            f"scales learned_absolute or sinusoidal positions; with "
            f"{m.position_embedding_type} positions it changes nothing",
            "model.position_embedding_multiplier",
            "model.position_embedding_type",
        )
    if m.position_embedding_type != "learned_absolute":
        return
    if m.max_position_embeddings and c.seq_length and c.seq_length + offset > m.max_position_embeddings:
        shifted = f" plus position_embedding_offset {offset}" if offset else ""
        yield error(
            "model.max_position_embeddings",
            f"expected at least the sequence length ({c.seq_length}){shifted} with learned_absolute positions, "
            f"found {m.max_position_embeddings}",
            "model.max_position_embeddings",
            *SEQ,
            *(("model.position_embedding_offset",) if offset else ()),
        )


def unsupported_architecture(c: NxdConfig) -> Iterator[Finding]:
    m, ds = c.model, c.distributed_strategy
    if m.transformer_block_type not in BLOCK_TYPES:
        yield error(
            "model.transformer_block_type",
            f"expected one of {', '.join(BLOCK_TYPES)} (the block types nxd "
            f"builds), found {m.transformer_block_type!r}",
        )
    if m.position_embedding_type in ("alibi", "rpe") and ds.context_parallel_size > 1:
        yield error(
            "model.position_embedding_type",
            f"{m.position_embedding_type} is not available with context "
            f"parallelism (ring attention sees no whole score matrix to bias); expected distributed_strategy."
            f"context_parallel_size 1, found {ds.context_parallel_size}",
            "model.position_embedding_type",
            CP,
        )
    if m.qk_layernorm and c.model_source == "megatron" and m.num_kv_heads not in (None, m.num_attention_heads):
        yield error(
            "model.qk_layernorm",
            f"the query/key norm's weights are one per query head, and nxd keeps fewer "
            f"key heads unrepeated; expected num_kv_heads {m.num_attention_heads} (or null) with it, found "
            f"{m.num_kv_heads}",
            "model.qk_layernorm",
            "model.num_kv_heads",
        )
    if c.model_source == "megatron" and m.position_embedding_type != "rpe":
        unused = [
            f"model.{name}"
            for name, default in (("rpe_num_buckets", 32), ("rpe_max_distance", 128))
            if getattr(m, name) != default
        ]
        if unused:
            yield notice(
                unused[0],
                f"acted on only with position_embedding_type rpe; with "
                f"{m.position_embedding_type} {' and '.join(unused)} change nothing",
                *unused,
            )
    if m.position_embedding_type == "rpe" and c.model_source == "megatron" and ds.pipeline_model_parallel_size > 1:
        yield error(
            "model.position_embedding_type",
            f"rpe's one table serves every layer, so pipeline stages would "
            f"each train a copy that drifts apart (as GPT-NeoX's do); expected {PP} 1, found "
            f"{ds.pipeline_model_parallel_size}",
            "model.position_embedding_type",
            PP,
        )
    yield from attention_layers(c)
    if ds.token_shuffle_group_size != 1:
        yield error(
            "distributed_strategy.token_shuffle_group_size",
            f"expected 1: nxd routes tokens in their own order, found {ds.token_shuffle_group_size}",
        )


def soft_prompt(c: NxdConfig) -> Iterator[Finding]:
    prompt, ds, key = c.model.soft_prompt, c.distributed_strategy, "model.soft_prompt"
    if prompt is None or c.model_source != "megatron":
        return
    for size, path, why in (
        (
            ds.pipeline_model_parallel_size,
            PP,
            "the prompt enters before the first stage's layers and the last drops its positions",
        ),
        (ds.context_parallel_size, CP, "ring attention splits the sequence the prompt lengthens"),
    ):
        if size > 1:
            yield error(key, f"{why}; expected {path} 1 with a soft prompt, found {size}", key, path)
    a = c.model_alignment_strategy
    if a is not None and a.peft is not None:
        yield error(
            key,
            "a soft prompt trains alone (every other weight frozen); expected no model_alignment_strategy.peft with it",
            key,
            f"{ALIGN}.peft",
        )
    method = next((name for name in METHODS if name != "sft" and a is not None and getattr(a, name) is not None), None)
    if method is not None:
        yield error(
            key,
            f"expected language-model training or sft with a soft prompt (GPT-NeoX's train_impl normal), "
            f"found {ALIGN}.{method}",
            key,
            f"{ALIGN}.{method}",
        )
    tp, length = ds.tensor_model_parallel_size, c.seq_length
    if ds.sequence_parallel and length is not None and (length + prompt.n_tokens) % tp:
        yield error(
            f"{key}.n_tokens",
            f"sequence parallelism splits the prompt and the sequence together; expected "
            f"n_tokens + the sequence length ({length}) to be a multiple of {TP} ({tp}), found "
            f"{prompt.n_tokens}",
            f"{key}.n_tokens",
            TP,
            SP,
        )


def maximal_update(c: NxdConfig) -> Iterator[Finding]:
    mup, key = c.model.mup, "model.mup"
    if mup is None:
        return
    if c.model_source != "megatron":
        yield error(
            key,
            f"muP rescales nxd's Megatron-style layers; expected model_source megatron, found {c.model_source}",
            key,
            "model_source",
        )
        return
    if not mup.base_shapes_file:
        yield error(
            f"{key}.base_shapes_file",
            "expected the base-shape file to read (or to write, with save_base_shapes), found none",
            f"{key}.base_shapes_file",
        )
    a = c.model_alignment_strategy
    for name, why in (
        ("peft", "LoRA's adapters have no base widths"),
        ("reward_model", "its score head has no base widths"),
    ):
        if a is not None and getattr(a, name) is not None:
            yield error(key, f"{why}; expected no {ALIGN}.{name} with muP", key, f"{ALIGN}.{name}")
    name = c.model.optim.name
    if name not in ("adam", "adamw", "adamw_fp32OptState", "sgd"):
        yield error(
            key,
            f"muP scales the steps of Adam (MuAdam) and SGD (MuSGD); expected model.optim.name adam, "
            f"adamw, adamw_fp32OptState or sgd, found {name}",
            key,
            "model.optim.name",
        )
    if mup.save_base_shapes and mup.coord_check:
        yield error(
            f"{key}.coord_check",
            "save_base_shapes writes the base-shape file the coordinate check reads, "
            "each instead of training; expected one of them true per run",
            f"{key}.coord_check",
            f"{key}.save_base_shapes",
        )
    for knob, switch in (("width_scale", "save_base_shapes"), ("coord_check_widths", "coord_check")):
        if mup.is_set(knob) and not getattr(mup, switch):
            yield notice(
                f"{key}.{knob}",
                f"acted on only with {switch}: true; changes nothing here",
                f"{key}.{knob}",
                f"{key}.{switch}",
            )
    heads, channels = c.model.num_attention_heads, c.model.kv_channels
    for width in mup.coord_check_widths or ():
        if width < 1 or (heads and not channels and width % heads):
            yield error(
                f"{key}.coord_check_widths",
                f"expected hidden sizes that num_attention_heads ({heads}) divides, found {width}",
                f"{key}.coord_check_widths",
                "model.num_attention_heads",
            )


def sliding_window_within_the_sequence(c: NxdConfig) -> Iterator[Finding]:
    window = c.model.sliding_window_size
    if c.model_source == "megatron" and window is not None and c.seq_length is not None and window > c.seq_length:
        yield notice(
            "model.sliding_window_size",
            f"{window} is wider than the sequence ({c.seq_length} tokens), so "
            "attention is full causal attention, as in transformers",
            *SEQ,
        )
