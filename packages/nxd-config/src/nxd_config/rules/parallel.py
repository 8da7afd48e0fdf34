"""The parallel layout: sizes that divide the world and the batch, heads and sequences that split, pipelines, ZeRO
and recompute."""

from __future__ import annotations

from collections.abc import Iterator

from ..schema import NxdConfig
from .findings import CP, DEVICES, GBS, MBS, NODES, PP, SEQ, SP, TP, VPP, Finding, error


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


def heads_divisible_by_tp(c: NxdConfig) -> Iterator[Finding]:
    m, tp = c.model, c.distributed_strategy.tensor_model_parallel_size
    if m.num_attention_heads is not None and m.num_attention_heads % tp:
        yield error(
            "model.num_attention_heads",
            f"expected a multiple of tensor_model_parallel_size ({tp}), found {m.num_attention_heads}",
            "model.num_attention_heads",
            TP,
        )


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


def context_parallel_needs_ring_attention(c: NxdConfig) -> Iterator[Finding]:
    cp = c.distributed_strategy.context_parallel_size
    if cp > 1 and not c.model.fusions.ring_attention:
        yield error(
            "model.fusions.ring_attention",
            f"expected True because context_parallel_size is {cp}, found {c.model.fusions.ring_attention}",
            "model.fusions.ring_attention",
            CP,
        )


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
