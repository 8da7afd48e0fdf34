"""`distributed_strategy`: how the model and data are spread over the processes."""

from __future__ import annotations

from ._base import Section, Status, key

PAR = "nxd-parallel"


class DistributedStrategyConfig(Section):
    tensor_model_parallel_size: int = key(1, "Tensor-parallel degree (tp).", by=PAR, ge=1)
    pipeline_model_parallel_size: int = key(1, "Pipeline-parallel degree (pp).", by=PAR, ge=1)
    virtual_pipeline_model_parallel_size: int | None = key(
        1, "Virtual stages per pipeline rank (interleaved 1F1B); 1 or null means none.", by=PAR, ge=1
    )
    context_parallel_size: int = key(
        1, "Context-parallel degree (cp); > 1 needs model.fusions.ring_attention.", by=PAR, ge=1
    )
    zero1: bool = key(
        True,
        "Shard optimizer state and gradients over data-parallel ranks (ZeRO-1; the gradients too, which is "
        "ZeRO-2's sharding).",
        by=PAR,
    )
    zero3: bool = key(
        False,
        "With zero1: each decoder layer gathers its parameters for its forward, frees them, and gathers them "
        "again for its backward (ZeRO-3), so a rank holds its shards and about two layers' whole parameters.",
        by=PAR,
        status=Status.EXTENSION,
        note="DeepSpeed's ZeRO stage 3 (GPT-NeoX files); NxDT has zero1 only",
    )
    cpu_offload: bool = key(
        False,
        "With zero1: each rank's shards of the parameters, gradients and optimizer state live in host memory "
        "and the optimizer steps there (FSDP2's CPUOffloadPolicy); the device holds the gathered parameters while "
        "computing. Needs more than one data-parallel rank.",
        by=PAR,
        status=Status.EXTENSION,
        note="DeepSpeed's zero_optimization offload_optimizer / offload_param (GPT-NeoX files)",
    )
    collective_timeout: int = key(
        1800,
        "Seconds a rank waits for a silent peer (no heartbeat) before every rank stops with one message naming "
        "it; also the timeout of the default process group and the checkpoint group (gloo, NCCL), which torch "
        "applies to start-up too.",
        by=PAR,
        status=Status.EXTENSION,
        ge=1,
        note="torch's own default is the same 30 minutes; NxDT has no such key",
    )
    sequence_parallel: bool = key(
        False, "Shard norm and dropout activations along the sequence over the tp ranks.", by=PAR
    )
    kv_replicator: int = key(
        1,
        "Copies of each KV head, so that tp may exceed num_kv_heads (an integer, not a flag).",
        by=PAR,
        ge=1,
    )
    expert_model_parallel_size: int = key(
        1,
        "Expert-parallel degree (ep) of a mixture-of-experts model: the data-parallel ranks form groups of ep, "
        "each rank holding num_experts / ep experts of every MoE layer; tokens travel to their experts' ranks "
        "and back by all-to-all. Must divide num_experts and the data-parallel size.",
        by=PAR,
        ge=1,
    )
    token_shuffle_group_size: int = key(
        1,
        "Token shuffle group for mixture-of-experts routing.",
        by=PAR,
        status=Status.LIMITED,
        note="only 1: nxd routes tokens in their own order (no shuffle)",
        ge=1,
    )
