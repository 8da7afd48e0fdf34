"""Cross-field rules: what no single key's type can say.

Each rule reads a built `NxdConfig` and yields `Finding`s that name the keys they depend on, so
that a finding about a key the validator had to repair (because its value was invalid) can be
dropped. A finding is an error unless it is a notice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .errors import ConfigIssue
from .schema import NxdConfig
from .schema.alignment import METHODS, PREFERENCE_METHODS
from .schema.model import GATED_ACTIVATIONS
from .schema.precision import LOSS_SCALING, MANUAL_KNOBS

TP = "distributed_strategy.tensor_model_parallel_size"
PP = "distributed_strategy.pipeline_model_parallel_size"
CP = "distributed_strategy.context_parallel_size"
VPP = "distributed_strategy.virtual_pipeline_model_parallel_size"
SP = "distributed_strategy.sequence_parallel"
GATING = ("gmlp", "amlp")
"""model.attention_layers' gMLP kinds: a block in place of attention and MLP, mixing positions by a weight matrix."""
DEVICES, NODES = "trainer.devices", "trainer.num_nodes"
MBS, GBS = "data.micro_batch_size", "data.global_batch_size"
SEQ = ("model.encoder_seq_length", "data.seq_length")
ALIGN = "model_alignment_strategy"
BLOCK_TYPES = ("pre_ln", "gpt_j", "gpt_neox")

MEGATRON_ONLY = (
    "ffn_hidden_size",
    "num_attention_heads",
    "num_kv_heads",
    "kv_channels",
    "init_method_std",
    "use_scaled_init_method",
    "hidden_dropout",
    "attention_dropout",
    "ffn_dropout",
    "apply_query_key_layer_scaling",
    "normalization",
    "layernorm_epsilon",
    "make_vocab_size_divisible_by",
    "persist_layer_norm",
    "share_embeddings_and_output_weights",
    "position_embedding_type",
    "rotary_percentage",
    "activation",
    "transformer_block_type",
    "has_bias",
    "sliding_window_size",
    "attention_bias",
    "mlp_bias",
    "init_method",
    "output_layer_init_method",
    "position_embedding_offset",
    "rpe_num_buckets",
    "rpe_max_distance",
    "qk_layernorm",
    "attention_layers",
    "sparse_attention",
    "num_unique_layers",
    "param_sharing_style",
    "soft_prompt",
    "position_embedding_multiplier",
    "position_embedding_norm",
)
"""Keys that describe a Megatron-style architecture; for hf, config.json describes it."""


@dataclass(frozen=True)
class Finding:
    issue: ConfigIssue
    inputs: tuple[str, ...]
    notice: bool = False


Rule = Callable[[NxdConfig], Iterator[Finding]]
RULES: list[Rule] = []


def rule(function: Rule) -> Rule:
    RULES.append(function)
    return function


def error(path: str, message: str, *inputs: str) -> Finding:
    return Finding(ConfigIssue(path, message), inputs or (path,))


def notice(path: str, message: str, *inputs: str) -> Finding:
    return Finding(ConfigIssue(path, message), inputs or (path,), notice=True)


def check(config: NxdConfig, repaired: list[str]) -> list[Finding]:
    """Run every rule; drop findings that depend on a repaired key."""
    findings = [finding for rule_ in RULES for finding in rule_(config)]
    return [f for f in findings if not any(_overlaps(i, r) for i in f.inputs for r in repaired)]


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".") or a.startswith(b + "[")


# --------------------------------------------------------------------------- parallel layout


@rule
def parallel_sizes_divide_world(c: NxdConfig) -> Iterator[Finding]:
    ds, tr = c.distributed_strategy, c.trainer
    if c.world_size % c.model_parallel_size:
        yield error(
            "distributed_strategy",
            f"expected tensor * pipeline * context parallel sizes ({ds.tensor_model_parallel_size} * "
            f"{ds.pipeline_model_parallel_size} * {ds.context_parallel_size} = {c.model_parallel_size}) "
            f"to divide trainer.devices * trainer.num_nodes ({tr.devices} * {tr.num_nodes} = "
            f"{c.world_size}), found a remainder of {c.world_size % c.model_parallel_size}",
            TP,
            PP,
            CP,
            DEVICES,
            NODES,
        )


@rule
def global_batch_divisible(c: NxdConfig) -> Iterator[Finding]:
    gbs = c.data.global_batch_size
    if gbs is None or c.world_size % c.model_parallel_size:
        return
    per_step = c.data.micro_batch_size * c.data_parallel_size
    if gbs % per_step:
        yield error(
            GBS,
            f"expected a multiple of data.micro_batch_size * data-parallel size "
            f"({c.data.micro_batch_size} * {c.data_parallel_size} = {per_step}), found {gbs}",
            GBS,
            MBS,
            TP,
            PP,
            CP,
            DEVICES,
            NODES,
        )


@rule
def pipeline_has_micro_batches_for_its_stages(c: NxdConfig) -> Iterator[Finding]:
    """torch's 1F1B schedule runs at least as many micro-batches per step as stages; the interleaved one a
    multiple of its rounds (micro-batches // stages)."""
    ds = c.distributed_strategy
    pp, vpp = ds.pipeline_model_parallel_size, ds.virtual_pipeline_model_parallel_size
    gbs, per_step = c.global_batch_size, c.data.micro_batch_size * c.data_parallel_size
    if pp == 1 or c.world_size % c.model_parallel_size or gbs % per_step:
        return
    count = gbs // per_step
    rounds = max(1, count // pp)
    how = (
        f"global_batch_size / (micro_batch_size * data-parallel size) = {gbs} / ({c.data.micro_batch_size} * "
        f"{c.data_parallel_size}) = {count}"
    )
    if (vpp or 1) == 1 and count < pp:
        yield error(
            GBS,
            f"expected at least {pp} micro-batches per step with {pp} pipeline stages (1F1B), found {how}",
            GBS,
            MBS,
            PP,
            TP,
            CP,
            DEVICES,
            NODES,
        )
    elif (vpp or 1) > 1 and count % rounds:
        yield error(
            GBS,
            f"expected a multiple of {rounds} micro-batches per step (interleaved 1F1B runs them in "
            f"rounds of the pipeline size {pp}), found {how}",
            GBS,
            MBS,
            PP,
            VPP,
            TP,
            CP,
            DEVICES,
            NODES,
        )


@rule
def heads_divisible_by_tp(c: NxdConfig) -> Iterator[Finding]:
    m, tp = c.model, c.distributed_strategy.tensor_model_parallel_size
    if m.num_attention_heads is not None and m.num_attention_heads % tp:
        yield error(
            "model.num_attention_heads",
            f"expected a multiple of tensor_model_parallel_size ({tp}), found {m.num_attention_heads}",
            "model.num_attention_heads",
            TP,
        )


@rule
def kv_heads_fit_tp(c: NxdConfig) -> Iterator[Finding]:
    m, ds = c.model, c.distributed_strategy
    if m.num_attention_heads is None:
        return
    kv_heads = m.num_kv_heads or m.num_attention_heads
    if m.num_kv_heads is not None and m.num_attention_heads % m.num_kv_heads:
        yield error(
            "model.num_kv_heads",
            f"expected a divisor of model.num_attention_heads ({m.num_attention_heads}), found {kv_heads}",
            "model.num_kv_heads",
            "model.num_attention_heads",
        )
    copies = kv_heads * ds.kv_replicator
    if copies % ds.tensor_model_parallel_size:
        yield error(
            "distributed_strategy.kv_replicator",
            f"expected num_kv_heads * kv_replicator ({kv_heads} * {ds.kv_replicator} = {copies}) to be "
            f"a multiple of tensor_model_parallel_size ({ds.tensor_model_parallel_size}), found it is not "
            f"(try kv_replicator: {_kv_replicator_hint(kv_heads, ds.tensor_model_parallel_size)})",
            "distributed_strategy.kv_replicator",
            "model.num_kv_heads",
            "model.num_attention_heads",
            TP,
        )


def _kv_replicator_hint(kv_heads: int, tp: int) -> int:
    return next(r for r in range(1, tp + 1) if (kv_heads * r) % tp == 0)


@rule
def sequence_splits_evenly(c: NxdConfig) -> Iterator[Finding]:
    ds = c.distributed_strategy
    lengths = {SEQ[0]: c.model.encoder_seq_length, SEQ[1]: c.data.seq_length}
    for path, length in lengths.items():
        if length is None:
            continue
        tp, cp = ds.tensor_model_parallel_size, ds.context_parallel_size
        if ds.sequence_parallel and length % tp:
            yield error(
                path,
                f"expected a multiple of tensor_model_parallel_size ({tp}) because sequence_parallel "
                f"is on, found {length}",
                path,
                TP,
                SP,
            )
        if cp > 1 and length % (2 * cp):
            yield error(
                path,
                f"expected a multiple of 2 * context_parallel_size ({2 * cp}) for the load-balanced "
                f"context split, found {length}",
                path,
                CP,
            )


@rule
def sequence_curriculum(c: NxdConfig) -> Iterator[Finding]:
    cur, ds, path = c.data.curriculum, c.distributed_strategy, "data.curriculum"
    if not cur.enabled:
        return
    if ds.pipeline_model_parallel_size > 1:
        yield error(
            path,
            "pipeline stages exchange activations of one fixed shape, and the curriculum changes the "
            f"sequence length; expected pipeline_model_parallel_size 1, found "
            f"{ds.pipeline_model_parallel_size}",
            path,
            PP,
        )
    a = c.model_alignment_strategy
    if a is not None and a.method is not None:
        yield error(
            path,
            f"cuts pretraining samples (as GPT-NeoX cuts them); {a.method}'s records would lose the "
            "tokens they train on; expected data.curriculum.enabled False",
            path,
            ALIGN,
        )
    seq = c.seq_length
    longest = cur.max_length or seq
    if seq is not None and longest is not None and longest > seq:
        yield error(
            f"{path}.max_length",
            f"expected at most the sequence length ({seq}), found {longest}",
            f"{path}.max_length",
            *SEQ,
        )
    if cur.schedule == "fixed_discrete":
        if not cur.lengths or len(cur.max_steps) != len(cur.lengths) - 1:
            yield error(
                f"{path}.max_steps",
                f"expected one fewer max_steps than lengths (the last length stays), "
                f"found {len(cur.max_steps)} for {len(cur.lengths)} lengths",
            )
        elif cur.lengths[0] != cur.min_length:
            yield error(f"{path}.lengths", f"expected min_length ({cur.min_length}) first, found {cur.lengths[0]}")
        elif cur.max_steps and (cur.max_steps[0] < 1 or list(cur.max_steps) != sorted(set(cur.max_steps))):
            yield error(f"{path}.max_steps", f"expected increasing steps from 1, found {list(cur.max_steps)}")
        used = set(cur.lengths)
    else:
        if cur.min_length < cur.length_step:
            yield error(
                f"{path}.min_length",
                f"expected at least length_step ({cur.length_step}): lengths are "
                f"rounded down to its multiples, found {cur.min_length}",
            )
        used = {cur.length_step}
    tp, cp = ds.tensor_model_parallel_size, ds.context_parallel_size
    divisor = math.lcm(tp if ds.sequence_parallel else 1, 2 * cp if cp > 1 else 1)
    uneven = sorted(length for length in used | {longest} if length is not None and length % divisor)
    if divisor > 1 and uneven:
        key = "lengths" if cur.schedule == "fixed_discrete" else "length_step"
        yield error(
            f"{path}.{key}",
            f"every length must split over the ranks that share a sequence (a multiple of "
            f"{divisor}: tensor parallel with sequence_parallel, 2 x context parallel); found "
            f"{', '.join(map(str, uneven))}",
            f"{path}.{key}",
            TP,
            CP,
        )


@rule
def character_level_perplexity_of_pretraining(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if c.trainer.char_level_ppl and a is not None and a.method is not None:
        yield error(
            "trainer.char_level_ppl",
            f"counts the characters of pretraining samples, whose every token the "
            f"loss covers (as GPT-NeoX counts them); {a.method} trains on part of its records; expected False",
            "trainer.char_level_ppl",
            ALIGN,
        )


@rule
def profiler_memory_dir_needs_memory(c: NxdConfig) -> Iterator[Finding]:
    p, path = c.exp_manager.profiler, "exp_manager.profiler.memory_dir"
    if p.memory_dir is not None and not p.memory:
        yield error(
            path,
            "names where memory records go; expected exp_manager.profiler.memory True with it, found False",
            path,
            "exp_manager.profiler.memory",
        )


@rule
def context_parallel_needs_ring_attention(c: NxdConfig) -> Iterator[Finding]:
    cp = c.distributed_strategy.context_parallel_size
    if cp > 1 and not c.model.fusions.ring_attention:
        yield error(
            "model.fusions.ring_attention",
            f"expected True because context_parallel_size is {cp}, found {c.model.fusions.ring_attention}",
            "model.fusions.ring_attention",
            CP,
        )


@rule
def pipeline_cuts_match_stages(c: NxdConfig) -> Iterator[Finding]:
    ds, cuts = c.distributed_strategy, c.model.pipeline_cuts
    pp, vpp = ds.pipeline_model_parallel_size, ds.virtual_pipeline_model_parallel_size or 1
    if cuts is not None and len(cuts) != pp * vpp - 1:
        expected = (
            f"pipeline_model_parallel_size - 1 = {pp - 1}"
            if vpp == 1
            else f"pipeline * virtual pipeline sizes - 1 = {pp} * {vpp} - 1 = {pp * vpp - 1}"
        )
        yield error(
            "model.pipeline_cuts", f"expected {expected} cut(s), found {len(cuts)}", "model.pipeline_cuts", PP, VPP
        )


@rule
def virtual_pipeline_fits(c: NxdConfig) -> Iterator[Finding]:
    ds = c.distributed_strategy
    vpp, pp, layers = ds.virtual_pipeline_model_parallel_size or 1, ds.pipeline_model_parallel_size, c.model.num_layers
    if vpp <= 1:
        return
    if pp <= 1:
        yield error(VPP, f"expected 1 unless pipeline_model_parallel_size > 1, found {vpp} with pp = {pp}", VPP, PP)
    elif layers is not None and layers % (pp * vpp):
        yield error(
            "model.num_layers",
            f"expected a multiple of pipeline * virtual pipeline sizes ({pp} * {vpp} = {pp * vpp}), found {layers}",
            "model.num_layers",
            VPP,
            PP,
        )


# --------------------------------------------------------------------------- model


@rule
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


@rule
def sequence_length_required(c: NxdConfig) -> Iterator[Finding]:
    if c.model.encoder_seq_length is None:
        yield error("model.encoder_seq_length", "expected the training sequence length, found nothing")


@rule
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


@rule
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
    yield from _attention_layers(c)
    if ds.token_shuffle_group_size != 1:
        yield error(
            "distributed_strategy.token_shuffle_group_size",
            f"expected 1: nxd routes tokens in their own order, found {ds.token_shuffle_group_size}",
        )


def _attention_layers(c: NxdConfig) -> Iterator[Finding]:
    m, key = c.model, "model.attention_layers"
    if c.model_source != "megatron":
        return
    kinds = set(m.attention_layers or ())
    if m.attention_layers is not None and m.num_layers is not None and len(m.attention_layers) != m.num_layers:
        yield error(
            key,
            f"expected one kind per layer (num_layers: {m.num_layers}), found {len(m.attention_layers)}",
            key,
            "model.num_layers",
        )
    unique, layers = m.num_unique_layers, m.num_layers
    if unique is not None and layers is not None and (unique > layers or layers % unique):
        yield error(
            "model.num_unique_layers",
            f"expected a divisor of num_layers ({layers}), found {unique}",
            "model.num_unique_layers",
            "model.num_layers",
        )
    if unique is not None and unique != layers and c.distributed_strategy.pipeline_model_parallel_size > 1:
        yield error(
            "model.num_unique_layers",
            f"a shared layer runs at several positions, which pipeline stages "
            f"would hold apart; expected {PP} 1, found {c.distributed_strategy.pipeline_model_parallel_size}",
            "model.num_unique_layers",
            PP,
        )
    if unique is not None and unique != layers and c.distributed_strategy.sequence_parallel:
        yield error(
            "model.num_unique_layers",
            f"sequence parallelism splits the sequence as the first layer begins, "
            f"and a shared first layer begins at several positions; expected {SP} false with it, found true",
            "model.num_unique_layers",
            SP,
        )
    if unique is not None and unique != layers and m.moe is not None:
        yield error(
            "model.moe",
            "MoE layers are counted over the stack's positions, and model.num_unique_layers "
            "shares layers between positions; expected one of them unset",
            "model.moe",
            "model.num_unique_layers",
        )
    if unique is not None and unique != layers and m.attention_layers is not None:
        yield error(
            key,
            "a kind per layer, and model.num_unique_layers shares layers; expected one of them unset",
            key,
            "model.num_unique_layers",
        )
    if unique is None and m.is_set("param_sharing_style"):
        yield notice(
            "model.param_sharing_style",
            "acted on only with model.num_unique_layers; without it every layer has its own weights",
            "model.param_sharing_style",
            "model.num_unique_layers",
        )
    sparse = sorted(kinds - {"dense", "mamba", "rwkv", *GATING})
    if sparse and c.distributed_strategy.context_parallel_size > 1:
        yield error(
            key,
            f"{', '.join(sparse)} layers attend by a block layout, which ring attention does not take; "
            f"expected {CP} 1, found {c.distributed_strategy.context_parallel_size}",
            key,
            CP,
        )
    gating, ds = ", ".join(sorted(kinds & set(GATING))), c.distributed_strategy
    mixing = f"{gating} layers mix every position of the sequence through one weight matrix"
    if gating and ds.context_parallel_size > 1:
        yield error(
            key,
            f"{mixing}, which context parallelism splits over ranks; expected {CP} 1, found {ds.context_parallel_size}",
            key,
            CP,
        )
    if gating and ds.sequence_parallel:
        yield error(
            key, f"{mixing}, which sequence parallelism splits over ranks; expected {SP} false, found true", key, SP
        )
    if gating and m.activation in GATED_ACTIVATIONS:
        yield error(
            "model.activation",
            f"{gating} layers split their inner activations into a value and a gate "
            f"themselves; expected an ungated activation, found {m.activation}",
            "model.activation",
            key,
        )
    if gating and m.moe is not None:
        yield error(
            "model.moe",
            f"{gating} layers have no MLP to replace with experts; expected one of model.moe and those layers",
            "model.moe",
            key,
        )
    scanning = ", ".join(sorted(kinds & {"mamba", "rwkv"}))
    if scanning and m.fusions.torch_compile:
        yield notice(
            "model.fusions.torch_compile",
            f"{scanning} layers scan the sequence one step at a time in "
            "Python: torch.compile unrolls every step, so compiling takes longer the longer the sequence",
            "model.fusions.torch_compile",
            key,
        )
    if scanning:
        for size, path, found in (
            (ds.context_parallel_size > 1, CP, ds.context_parallel_size),
            (ds.sequence_parallel, SP, "true"),
        ):
            if size:
                yield error(
                    key,
                    f"{scanning} layers scan the whole sequence from its start, which "
                    f"{'context' if path == CP else 'sequence'} parallelism splits over ranks; expected "
                    f"{path} {1 if path == CP else 'false'}, found {found}",
                    key,
                    path,
                )
        if m.moe is not None:
            yield error(
                "model.moe",
                f"{scanning} layers have no MLP to replace with experts; expected one of model.moe and those layers",
                "model.moe",
                key,
            )
        if m.soft_prompt is not None:
            yield error(
                "model.soft_prompt",
                f"every packed document sees the prompt's positions, which {scanning} "
                f"layers' scan cannot give; expected no soft prompt with them",
                "model.soft_prompt",
                key,
            )
    for kind, names in (
        ("mamba", ("mamba_inner_size", "mamba_conv_bias", "mamba_linear_bias")),
        ("rwkv", ("rwkv_dim_att", "rwkv_ffn_size")),
    ):
        for name in names:
            if kind not in kinds and m.is_set(name):
                yield notice(
                    f"model.{name}",
                    f"acted on only by {kind} layers (model.attention_layers); with none it changes nothing",
                    f"model.{name}",
                    key,
                )
    width = m.rwkv_dim_att or m.hidden_size
    if "rwkv" in kinds and width and m.num_attention_heads and width % m.num_attention_heads:
        yield error(
            "model.rwkv_dim_att",
            f"an rwkv layer's time mix has num_attention_heads heads; expected a "
            f"multiple of {m.num_attention_heads}, found {width}",
            "model.rwkv_dim_att",
            "model.num_attention_heads",
        )
    if "amlp" not in kinds and m.is_set("gmlp_attention_dim"):
        yield notice(
            "model.gmlp_attention_dim",
            "acted on only by amlp layers (model.attention_layers); with none it changes nothing",
            "model.gmlp_attention_dim",
            key,
        )
    if not sparse and m.is_set("sparse_attention"):
        yield notice(
            "model.sparse_attention",
            "acted on only by sparse layers (model.attention_layers); with none it changes nothing",
            "model.sparse_attention",
            key,
        )


@rule
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


@rule
def float8_all_gather(c: NxdConfig) -> Iterator[Finding]:
    fp8, key = c.precision.fp8, "precision.fp8.all_gather"
    if fp8 is None or not fp8.all_gather:
        return
    if not c.distributed_strategy.zero1:
        yield error(
            key,
            "weights are gathered only where ZeRO shards them (replicated data parallelism keeps them "
            "whole); expected distributed_strategy.zero1 True with it, found False",
            key,
            "distributed_strategy.zero1",
        )
    if (tp := c.distributed_strategy.tensor_model_parallel_size) > 1:
        yield error(
            key,
            f"with tensor parallelism torchao scales each rank's part of a weight by that part's own "
            f"maximum (the gather reduces it over the data-parallel ranks only), so the layers would compute "
            f"on other float8 weights than in one process; expected {TP} 1 with it, found {tp}",
            key,
            TP,
        )
    if fp8.recipe != "tensorwise":
        yield error(
            key,
            f"torchao gathers float8 weights for tensorwise scaling only; expected precision.fp8.recipe "
            f"tensorwise with it, found {fp8.recipe}",
            key,
            "precision.fp8.recipe",
        )


@rule
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


@rule
def mixture_of_experts(c: NxdConfig) -> Iterator[Finding]:
    moe, ds, key = c.model.moe, c.distributed_strategy, "model.moe"
    ep, ep_key = ds.expert_model_parallel_size, "distributed_strategy.expert_model_parallel_size"
    if moe is None:
        if ep != 1:
            yield error(ep_key, f"expected 1 without a model.moe block (a dense model has no experts), found {ep}")
        return
    if moe.num_experts is None or moe.num_experts < 2:
        yield error(
            f"{key}.num_experts",
            f"expected at least 2 experts (one expert is the dense MLP: remove the moe block), found {moe.num_experts}",
        )
    elif moe.top_k > moe.num_experts:
        yield error(
            f"{key}.top_k",
            f"expected at most num_experts ({moe.num_experts}), found {moe.top_k}",
            f"{key}.top_k",
            f"{key}.num_experts",
        )
    elif moe.num_experts % ep:
        yield error(
            ep_key,
            f"expected a divisor of model.moe.num_experts ({moe.num_experts}), found {ep}",
            ep_key,
            f"{key}.num_experts",
        )
    if moe.routing_algorithm == "sinkhorn" and moe.top_k != 1:
        yield error(
            f"{key}.routing_algorithm",
            f"sinkhorn balances top-1 routing only: expected top_k 1, found {moe.top_k}",
            f"{key}.routing_algorithm",
            f"{key}.top_k",
        )
    if moe.jitter_eps is not None and moe.routing_algorithm != "top_k":
        yield error(
            f"{key}.jitter_eps",
            f"the top-k router jitters its input (GPT-NeoX's Sinkhorn router does not); "
            f"expected routing_algorithm top_k with it, found {moe.routing_algorithm}",
            f"{key}.jitter_eps",
            f"{key}.routing_algorithm",
        )
    if moe.routing_algorithm == "deepspeed":
        if moe.top_k > 2:
            yield error(
                f"{key}.top_k",
                f"DeepSpeed's gate is top-1 or top-2: expected 1 or 2 with routing_algorithm "
                f"deepspeed, found {moe.top_k}",
                f"{key}.top_k",
                f"{key}.routing_algorithm",
            )
        for name, ours in (("router_activation", "softmax"), ("normalize_top_k_affinities", False)):
            if getattr(moe, name) != ours:
                yield error(
                    f"{key}.{name}",
                    f"DeepSpeed's gate weighs by softmax, renormalised for top-2 only: "
                    f"expected {ours} with routing_algorithm deepspeed, found {getattr(moe, name)}",
                    f"{key}.{name}",
                    f"{key}.routing_algorithm",
                )
        for name, k in (("random_token_selection", 1), ("sample_second_expert", 2)):
            if moe.is_set(name) and moe.top_k != k:
                yield notice(
                    f"{key}.{name}",
                    f"acted on only with top_k {k}; with top_k {moe.top_k} it changes nothing",
                    f"{key}.{name}",
                    f"{key}.top_k",
                )
    else:
        for name in ("random_token_selection", "sample_second_expert"):
            if moe.is_set(name):
                yield notice(
                    f"{key}.{name}",
                    f"acted on only by routing_algorithm deepspeed; with {moe.routing_algorithm} it changes nothing",
                    f"{key}.{name}",
                )
    unbounded = moe.dropless or not moe.capacity_factor
    for name in ("eval_capacity_factor", "min_capacity"):
        if unbounded and moe.is_set(name):
            yield notice(
                f"{key}.{name}",
                "acted on only when capacity drops tokens; without a capacity_factor every token is kept",
                f"{key}.{name}",
                f"{key}.capacity_factor",
            )
    if moe.residual and c.model_source != "megatron":
        yield error(
            f"{key}.residual",
            "PR-MoE's dense MLP beside the experts is built for Megatron-style models; "
            "expected false with a Hugging Face model",
            f"{key}.residual",
            "model_source",
        )
    if moe.dropless and moe.capacity_factor:
        yield error(
            f"{key}.capacity_factor",
            f"expected 0.0 or null with dropless: True (no token is dropped), found {moe.capacity_factor}",
            f"{key}.capacity_factor",
            f"{key}.dropless",
        )
    if not moe.dropless and moe.capacity_factor == 0.0:
        yield error(
            f"{key}.capacity_factor",
            "expected a positive factor, or dropless: True, found 0.0",
            f"{key}.capacity_factor",
            f"{key}.dropless",
        )
    if moe.router_aux_loss_coef and not moe.output_router_logits:
        yield error(
            f"{key}.router_aux_loss_coef",
            f"the load-balancing loss is computed with output_router_logits:"
            f" True; found {moe.router_aux_loss_coef} with False",
            f"{key}.router_aux_loss_coef",
            f"{key}.output_router_logits",
        )
    if c.model_source == "hf" and moe.frequency != 1:
        yield error(
            f"{key}.frequency",
            f"expected 1: a Hugging Face Mixtral has experts in every layer, found {moe.frequency}",
            f"{key}.frequency",
            "model_source",
        )
    if ds.context_parallel_size > 1:
        yield error(
            CP,
            f"expected 1 with a model.moe block (the router's balance is counted over whole "
            f"sequences), found {ds.context_parallel_size}",
            CP,
            key,
        )
    if c.world_size % c.model_parallel_size == 0 and c.data_parallel_size % ep:
        yield error(
            ep_key,
            f"expected a divisor of the data-parallel size ({c.data_parallel_size}: expert-parallel "
            f"groups are formed from data-parallel ranks), found {ep}",
            ep_key,
            TP,
            PP,
            CP,
            DEVICES,
            NODES,
        )


@rule
def checkpoints_ranked_by_a_loss_keep_the_lowest(c: NxdConfig) -> Iterator[Finding]:
    params, path = c.exp_manager.checkpoint_callback_params, "exp_manager.checkpoint_callback_params"
    if params.mode == "max" and params.monitor.endswith("loss") and params.save_top_k > 0:
        yield error(
            f"{path}.mode",
            f"expected min (or null) with monitor {params.monitor!r}: max keeps the "
            f"{params.save_top_k} worst checkpoints and deletes the better ones, found max",
            f"{path}.mode",
            f"{path}.monitor",
        )


@rule
def sliding_window_within_the_sequence(c: NxdConfig) -> Iterator[Finding]:
    window = c.model.sliding_window_size
    if c.model_source == "megatron" and window is not None and c.seq_length is not None and window > c.seq_length:
        yield notice(
            "model.sliding_window_size",
            f"{window} is wider than the sequence ({c.seq_length} tokens), so "
            "attention is full causal attention, as in transformers",
            *SEQ,
        )


@rule
def recompute_needs_selective(c: NxdConfig) -> Iterator[Finding]:
    m = c.model
    granularity = m.activations_checkpoint_granularity
    if m.activations_checkpoint_recompute and granularity != "selective":
        yield error(
            "model.activations_checkpoint_recompute",
            f"expected null unless activations_checkpoint_granularity is 'selective', found "
            f"{list(m.activations_checkpoint_recompute)} with granularity {granularity!r}",
            "model.activations_checkpoint_recompute",
            "model.activations_checkpoint_granularity",
        )
    if m.activations_checkpoint_recompute_mlp and granularity is None:
        yield error(
            "model.activations_checkpoint_recompute_mlp",
            "expected False when activations_checkpoint_granularity is null (no recomputation), found True",
            "model.activations_checkpoint_recompute_mlp",
            "model.activations_checkpoint_granularity",
        )


@rule
def optimizer_required(c: NxdConfig) -> Iterator[Finding]:
    if c.model.optim is None:
        yield error("model.optim", "expected an optimizer such as {name: adamw, lr: 3.0e-4}, found nothing")


@rule
def deepspeed_schedule_needs_a_rate(c: NxdConfig) -> Iterator[Finding]:
    optim = c.model.optim
    sched = None if optim is None else optim.sched
    if sched is not None and sched.name == "DeepSpeedSchedule" and sched.type != "WarmupCosineLR" and optim.lr == 0:
        yield error(
            "model.optim.lr",
            f"{sched.type} sets its rates as multiples of this one; expected more than 0, found 0",
            "model.optim.lr",
            "model.optim.sched",
        )


@rule
def one_cycle_stairs_are_not_read(c: NxdConfig) -> Iterator[Finding]:
    sched = None if c.model.optim is None else c.model.optim.sched
    if sched is None or sched.name != "DeepSpeedSchedule":
        return
    for name in ("cycle_first_stair_count", "cycle_second_stair_count"):
        if sched.is_set(name):
            path = f"model.optim.sched.{name}"
            yield notice(
                path,
                "accepted, changes nothing: DeepSpeed's OneCycle never reads it, so its cycle (and "
                "nxd's) is continuous",
                path,
            )


# --------------------------------------------------------------------------- trainer, data, checkpoints


@rule
def training_has_an_end(c: NxdConfig) -> Iterator[Finding]:
    if c.trainer.max_steps <= 0 and c.trainer.max_epochs <= 0:
        yield error(
            "trainer.max_steps",
            f"expected trainer.max_steps or trainer.max_epochs to be positive, found "
            f"{c.trainer.max_steps} and {c.trainer.max_epochs} (training would never end)",
            "trainer.max_steps",
            "trainer.max_epochs",
        )


@rule
def tabular_tokenizer_unsupported(c: NxdConfig) -> Iterator[Finding]:
    tokenizer = c.data.tokenizer
    if tokenizer is not None and tokenizer.delimiter is not None:
        yield error(
            "data.tokenizer.delimiter",
            f"expected null: the delimiter belongs to NeMo's "
            f"tabular tokenizer, which nxd does not support, found {tokenizer.delimiter!r}",
        )


@rule
def checkpoint_model_parallel_size(c: NxdConfig) -> Iterator[Finding]:
    given = c.exp_manager.checkpoint_callback_params.model_parallel_size
    ds = c.distributed_strategy
    derived = ds.tensor_model_parallel_size * ds.pipeline_model_parallel_size
    if given is not None and given != derived:
        path = "exp_manager.checkpoint_callback_params.model_parallel_size"
        yield error(path, f"expected tensor * pipeline parallel sizes ({derived}), found {given}", path, TP, PP)


# --------------------------------------------------------------------------- precision


@rule
def manual_knobs_need_manual(c: NxdConfig) -> Iterator[Finding]:
    p = c.precision
    if p.type == "manual":
        return
    for name, default in MANUAL_KNOBS.items():
        if getattr(p, name) != default:
            yield notice(
                f"precision.{name}",
                f"ignored: only read when precision.type is 'manual', found type {p.type!r} (which sets this itself)",
                f"precision.{name}",
                "precision.type",
            )


@rule
def zero3_needs_zero1(c: NxdConfig) -> Iterator[Finding]:
    ds = c.distributed_strategy
    if ds.zero3 and not ds.zero1:
        yield error(
            "distributed_strategy.zero3",
            "expected distributed_strategy.zero1 True with it (ZeRO-3 shards "
            "what ZeRO-1 shards, and the parameters between uses), found zero1 False",
            "distributed_strategy.zero3",
            "distributed_strategy.zero1",
        )


@rule
def cpu_offload_needs_sharding(c: NxdConfig) -> Iterator[Finding]:
    ds = c.distributed_strategy
    if not ds.cpu_offload:
        return
    if not ds.zero1:
        yield error(
            "distributed_strategy.cpu_offload",
            "expected distributed_strategy.zero1 True with it (what is "
            "offloaded is each rank's shard), found zero1 False",
            "distributed_strategy.cpu_offload",
            "distributed_strategy.zero1",
        )
    elif c.world_size % c.model_parallel_size == 0 and c.data_parallel_size * ds.context_parallel_size == 1:
        yield error(
            "distributed_strategy.cpu_offload",
            "expected more than one data-parallel rank (the offloaded state is the data-parallel shards), found one",
            "distributed_strategy.cpu_offload",
            "trainer.devices",
            "trainer.num_nodes",
        )


@rule
def loss_scaling_needs_fp16(c: NxdConfig) -> Iterator[Finding]:
    p = c.precision
    if p.type in ("fp16", "fp16_autocast"):
        return
    for name, default in LOSS_SCALING.items():
        if getattr(p, name) != default:
            yield error(
                f"precision.{name}",
                f"expected precision.type fp16 or fp16_autocast with loss scaling (it "
                f"scales fp16 "
                f"gradients), found type {p.type!r}",
                f"precision.{name}",
                "precision.type",
            )


# --------------------------------------------------------------------------- alignment


@rule
def one_alignment_method(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if a is None:
        return
    chosen = [name for name in METHODS if getattr(a, name) is not None]
    if len(chosen) > 1:
        yield error(
            ALIGN, f"expected at most one of {', '.join(METHODS)} (peft combines with any), found {', '.join(chosen)}"
        )


@rule
def preference_prompt_length(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if a is None:
        return
    for name in PREFERENCE_METHODS:
        block = getattr(a, name)
        if block is None:
            continue
        path = f"{ALIGN}.{name}.max_prompt_length"
        if _documents(c) is not None:
            for cut in ("max_prompt_length", "truncation_mode"):
                if block.is_set(cut):
                    yield error(
                        f"{ALIGN}.{name}.{cut}",
                        f"applies to data.train_dir records, which are cut into "
                        f"prompt and response; pre-tokenised documents ({_documents(c)}) are read as "
                        f"written; expected it unset, found {getattr(block, cut)!r}",
                    )
        elif block.max_prompt_length is None:
            yield error(path, "expected the longest prompt length in tokens, found nothing")
        elif c.seq_length is not None and block.max_prompt_length >= c.seq_length:
            yield error(
                path,
                f"expected less than the sequence length ({c.seq_length}) so that a "
                f"response fits, found {block.max_prompt_length}",
                path,
                *SEQ,
            )


@rule
def dpo_label_smoothing_fits_the_loss(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if a is None or a.dpo is None or a.dpo.label_smoothing == 0 or a.dpo.loss_type in ("sigmoid", "robust"):
        return
    path = f"{ALIGN}.dpo.label_smoothing"
    yield error(
        path,
        f"expected 0 with loss_type {a.dpo.loss_type} (label smoothing applies to sigmoid and robust), "
        f"found {a.dpo.label_smoothing}",
        path,
        f"{ALIGN}.dpo.loss_type",
    )


@rule
def alignment_needs_train_data(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if (
        a is not None
        and a.method is not None
        and c.data.train_dir is None
        and _documents(c) is None
        and c.data.dataset is None
    ):
        yield error(
            "data.train_dir",
            f"expected the {a.method.upper()} training data (a jsonl, "
            f"arrow or parquet file or a saved dataset), found nothing",
            "data.train_dir",
            ALIGN,
        )


@rule
def length_groups_need_records(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if c.data.group_by_length and (a is None or a.sft is None or _documents(c) is not None):
        yield error(
            "data.group_by_length",
            "groups fine-tuning records (model_alignment_strategy.sft with "
            "data.train_dir or data.dataset); found none to group",
            "data.group_by_length",
            ALIGN,
        )


@rule
def dataset_records(c: NxdConfig) -> Iterator[Finding]:
    d, a = c.data, c.model_alignment_strategy
    if d.dataset is None:
        return
    for other in ("train_dir", "val_dir"):
        if getattr(d, other) is not None:
            yield error(
                f"data.{other}", "expected one data source, found data.dataset as well", f"data.{other}", "data.dataset"
            )
    method = None if a is None else a.method
    wanted = ("dpo", "orpo", "reward_model") if d.dataset.kind == "preference" else ("sft",)
    if method not in wanted:
        yield error(
            "data.dataset.kind",
            f"{d.dataset.kind} records are trained by model_alignment_strategy."
            f"{' / '.join(wanted)}; found {method or 'pretraining'}",
            "data.dataset",
            ALIGN,
        )


@rule
def whole_document_samples_need_indexed_data(c: NxdConfig) -> Iterator[Finding]:
    d = c.data
    reads_records = d.train_dir is not None and (d.use_sft_style_data_module or not d.is_set("data_prefix"))
    if d.pack_impl != "packed" and reads_records:
        yield error(
            "data.pack_impl",
            f"expected packed with data.train_dir (its records are packed or padded by "
            f"their own keys); {d.pack_impl} cuts samples from data_prefix's indexed documents, found "
            f"{d.pack_impl}",
            "data.pack_impl",
            "data.train_dir",
        )
    if d.pack_impl == "packed" and not d.allow_chopped and _documents(c) is None:
        yield notice(
            "data.allow_chopped",
            "acted on only with pack_impl pack_until_overflow or unpacked; packed "
            "samples are cut across documents whatever their length",
            "data.allow_chopped",
        )


def _documents(c: NxdConfig) -> str | None:
    """The key of the run's pre-tokenised post-training documents, when it names some."""
    return next(
        (f"data.{name}" for name in ("pair_documents", "example_documents") if getattr(c.data, name) is not None), None
    )


@rule
def post_training_documents(c: NxdConfig) -> Iterator[Finding]:
    d, a = c.data, c.model_alignment_strategy
    method = None if a is None else a.method
    for name, methods in (("pair_documents", ("dpo", "orpo", "reward_model")), ("example_documents", ("kto",))):
        files = getattr(d, name)
        if files is None:
            continue
        path = f"data.{name}"
        if method not in methods:
            yield error(
                path,
                f"expected model_alignment_strategy.{' / '.join(methods)} to train on these documents, "
                f"found {method or 'pretraining'}",
                path,
                ALIGN,
            )
        if files.train is None:
            yield error(f"{path}.train", "expected the training documents, found none", path)
        for other in ("train_dir", "val_dir", "data_prefix"):
            if getattr(d, other) is not None and (other != "data_prefix" or d.is_set(other)):
                yield error(f"data.{other}", f"expected one data source, found {path} as well", f"data.{other}", path)
        if d.pack_impl != "unpacked" and d.is_set("pack_impl"):
            yield error(
                "data.pack_impl",
                f"expected unpacked with {path} (one document a row, as GPT-NeoX reads "
                f"post-training data), found {d.pack_impl}",
                "data.pack_impl",
                path,
            )
        splits = [split for split in (files.train, files.validation, files.test) if split is not None]
        referenced = [
            split
            for split in splits
            if any(
                getattr(split, key, None) is not None for key in ("chosen_reference", "rejected_reference", "reference")
            )
        ]
        if referenced and len(referenced) != len(splits):
            yield error(
                path,
                "expected reference log-prob files for every split or for none, found them for "
                f"{len(referenced)} of {len(splits)}",
                path,
            )
        if referenced and method is not None and a is not None:
            block = getattr(a, method)
            if method in ("orpo", "reward_model") or getattr(block, "reference_free", False):
                why = "reference_free" if method == "dpo" else method.upper()
                yield error(
                    path,
                    f"reference log-prob files are read by DPO and KTO against a reference model; "
                    f"{why} has none: expected no reference files",
                    path,
                    ALIGN,
                )
            elif block.is_set("precompute_ref_log_probs") and not block.precompute_ref_log_probs:
                yield error(
                    f"{ALIGN}.{method}.precompute_ref_log_probs",
                    "expected true (or unset) with reference "
                    "log-prob files, which are the precomputed reference; found false",
                    path,
                )


@rule
def kto_kl_estimate_fits_the_data(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if a is None or a.kto is None:
        return
    path = f"{ALIGN}.kto.kl_estimate"
    documents = c.data.example_documents is not None
    if a.kto.kl_estimate == "mismatched" and documents:
        yield error(
            path,
            "expected batch_halves with data.example_documents: the mismatched estimate pairs each "
            "prompt with another record's completion, which pre-tokenised documents do not separate; found "
            "mismatched",
            path,
            "data.example_documents",
        )
    if a.kto.kl_estimate == "batch_halves":
        if not documents:
            yield error(
                path,
                "expected mismatched with data.train_dir records (batch_halves reads "
                "data.example_documents), found batch_halves",
                path,
                "data.train_dir",
            )
        if c.data.micro_batch_size % 2:
            yield error(
                MBS,
                f"expected an even micro-batch size with kl_estimate batch_halves (each half's KL is "
                f"measured on the other half), found {c.data.micro_batch_size}",
                MBS,
                path,
            )


@rule
def reward_packing_under_pipelines(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if a is None or a.reward_model is None or not a.reward_model.is_set("packing") or not a.reward_model.packing:
        return
    d = c.distributed_strategy
    if d.pipeline_model_parallel_size > 1 or d.context_parallel_size > 1:
        path, why = f"{ALIGN}.reward_model.packing", []
        if d.pipeline_model_parallel_size > 1:
            why.append("pipeline parallelism (its stages pass one shape)")
        if d.context_parallel_size > 1:
            why.append("context parallelism (its ring attention would compute the whole packed row)")
        yield notice(path, f"rows stay padded under {' and '.join(why)}; the scores are the same", path, PP, CP)
