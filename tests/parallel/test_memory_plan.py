"""The memory plan against counts worked by hand and against autograd's own saved tensors."""

from __future__ import annotations

import torch
from nxd_models import GPTConfig, build_causal_lm, model_family
from nxd_models.attention import rotary_cos_sin
from nxd_parallel import GIB, LayerWidths, Layout, ParallelDims, StateBytes, Workload, memory_plan, pipeline_ranges
from nxd_precision import bytes_per_value, resolve_policy

SPEC = GPTConfig(
    vocab_size=128,
    num_layers=4,
    hidden_size=64,
    num_attention_heads=4,
    num_kv_heads=2,
    seq_length=32,
    ffn_hidden_size=96,
    normalization="rmsnorm",
    activation="swiglu",
    position_embedding_type="rope",
    has_bias=False,
    make_vocab_size_divisible_by=8,
    share_embeddings_and_output_weights=False,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)
FP32 = StateBytes(parameter=4, gradient=4, master=0, optimizer_state=8, step_copies=0, compute=4)
# one decoder layer: norms 2 x 64, q 64 x 64, k and v 32 x 64, o 64 x 64, gate/up/down 3 x 96 x 64
LAYER = 2 * 64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 96 * 64
EMBED = OUTPUT = 128 * 64


def _dims(tp: int = 1, pp: int = 1, cp: int = 1, dp: int = 1, ep: int = 1) -> ParallelDims:
    """The layout of tp x pp x cp x dp ranks."""
    return ParallelDims(tp * pp * cp * dp, tp=tp, pp=pp, cp=cp, ep=ep)


def _plan(
    sizes: ParallelDims,
    layout: Layout = Layout(),  # noqa: B008
    state: StateBytes = FP32,
    work=Workload(2, 32, 4),  # noqa: B008
    spec: GPTConfig = SPEC,
) -> list:
    family = model_family(spec)
    meta = family.build_on_meta()
    return memory_plan(
        meta,
        family.tp_plan(),
        pipeline_ranges(family, meta, layout, sizes.pp),
        LayerWidths(**family.layer_widths()),
        sizes=sizes,
        state=state,
        work=work,
        zero1=layout.zero1,
        zero3=layout.zero3,
        sequence_parallel=layout.sequence_parallel,
        kv_replicator=layout.kv_replicator,
        recompute=layout.recompute,
        recompute_modules=layout.recompute_modules,
        cpu_offload=layout.cpu_offload,
    )


def test_parameters_split_as_each_layout_shards_them():
    whole = 4 * LAYER + EMBED + OUTPUT + 64  # the final norm
    assert _plan(_dims())[0].parameters == 4 * whole
    # tp2: every matmul weight, the embedding and the output split; the 9 norms stay whole
    norms = 4 * 2 * 64 + 64
    assert _plan(_dims(tp=2))[0].parameters == 4 * ((whole - norms) // 2 + norms)
    # kv_replicator 2: the k and v weights stay whole on both ranks
    kv = 4 * 2 * 32 * 64
    assert _plan(_dims(tp=2), Layout(kv_replicator=2))[0].parameters == 4 * ((whole - norms - kv) // 2 + norms + kv)
    # pp2: two layers each, the embedding first and the final norm and output layer last
    first, last = _plan(_dims(pp=2))
    assert (first.parameters, last.parameters) == (4 * (2 * LAYER + EMBED), 4 * (2 * LAYER + OUTPUT + 64))
    # ZeRO-1 over 2 ranks: half of each state, plus the gathered parameters FSDP2 computes with
    zero1 = _plan(_dims(dp=2), Layout(zero1=True))[0]
    assert (zero1.parameters, zero1.gradients, zero1.optimizer_state) == (
        4 * whole // 2 + 4 * whole,
        4 * whole // 2,
        8 * whole // 2,
    )
    # ZeRO-3: the same shards; gathered, the embedding, final norm and output layer and two layers at a time
    zero3 = _plan(_dims(dp=2), Layout(zero1=True, zero3=True))[0]
    assert (zero3.parameters, zero3.gradients) == (
        4 * whole // 2 + 4 * (EMBED + OUTPUT + 64 + 2 * LAYER),
        4 * whole // 2,
    )
    # CPU offload: the shards (parameters, gradients, optimizer state) in host memory, the gathered copies on
    # the device
    offloaded = _plan(_dims(dp=2), Layout(zero1=True, zero3=True, cpu_offload=True))[0]
    assert (offloaded.parameters, offloaded.gradients, offloaded.optimizer_state) == (
        4 * (EMBED + OUTPUT + 64 + 2 * LAYER),
        0,
        0,
    )
    assert offloaded.offloaded == (4 + 4 + 8) * whole // 2
    assert offloaded.total == zero3.total - (4 + 4 + 8) * whole // 2


def test_eight_bit_adam_divides_its_state_where_shards_are_whole_blocks():
    """adam8bit keeps 2 bytes per value in blocks of 256 consecutive values of the whole tensor. 512 wide (every
    last axis a multiple of 512): each shard of tp2 or ZeRO over 2 ranks is whole blocks, so the state divides
    as AdamW's 8 bytes do. 64 wide (SPEC): rows are not whole blocks, and every rank keeps 2 bytes per value of
    the model."""
    wide = GPTConfig(**{**SPEC.__dict__, "hidden_size": 512, "ffn_hidden_size": 1024, "vocab_size": 256})
    state = StateBytes(**bytes_per_value(resolve_policy("fp32"), "adam8bit", {}))
    assert (state.optimizer_state, state.block_state) == (0, 2)
    for sizes, layout in (
        (_dims(), Layout()),
        (_dims(tp=2), Layout()),
        (_dims(dp=2), Layout(zero1=True)),
        (_dims(dp=2, tp=2), Layout(zero1=True)),
    ):
        adamw = _plan(sizes, layout, FP32, spec=wide)[0].optimizer_state
        assert _plan(sizes, layout, state, spec=wide)[0].optimizer_state * 4 == adamw, (sizes, layout)
    # 768 wide: o_proj's tp2 halves of 384 columns would cut blocks, so it keeps its whole last axis (2 bytes for
    # its other half too); down_proj's halves of 1536 columns are 768, whole blocks
    cut = GPTConfig(**{**SPEC.__dict__, "hidden_size": 768, "ffn_hidden_size": 1536, "vocab_size": 256})
    halves = _plan(_dims(tp=2), Layout(), FP32, spec=cut)[0].optimizer_state // 4
    other_halves = 4 * 768 * 768 // 2  # o_proj of 4 layers
    assert _plan(_dims(tp=2), Layout(), state, spec=cut)[0].optimizer_state == halves + 2 * other_halves
    whole = 4 * LAYER + EMBED + OUTPUT + 64
    for sizes, layout in ((_dims(), Layout()), (_dims(tp=2), Layout()), (_dims(dp=2), Layout(zero1=True))):
        assert _plan(sizes, layout, state)[0].optimizer_state == 2 * whole
    first, last = _plan(_dims(pp=2), Layout(), state)
    assert (first.optimizer_state, last.optimizer_state) == (2 * (2 * LAYER + EMBED), 2 * (2 * LAYER + OUTPUT + 64))


def test_precision_types_cost_what_their_dtypes_say():
    mixed = bytes_per_value(resolve_policy("mixed_precision"), "adamw", {})
    # bf16 weight 2, fp32 gradient 4, fp32 master 4, two fp32 moments 8: 18 bytes per trained value
    assert (mixed["parameter"], mixed["gradient"], mixed["master"], mixed["optimizer_state"]) == (2, 4, 4, 8)
    assert mixed["step_copies"] == 0 and mixed["compute"] == 2
    sr = bytes_per_value(resolve_policy("bf16SR"), "adamw", {})
    # bf16 weight, gradient and moments; the step makes fp32 copies of weights and gradients (8) and
    # holds the two moments in fp32 (2 x 2 more)
    assert (sr["parameter"], sr["gradient"], sr["master"], sr["optimizer_state"], sr["step_copies"]) == (2, 2, 0, 4, 12)
    assert bytes_per_value(resolve_policy("fp32"), "sgd", {"momentum": 0.0})["optimizer_state"] == 0


def _saved_layer_bytes() -> int:
    """What autograd keeps for the backward of one decoder layer's forward (batch 2 x 32 tokens), each
    storage once, weights and RoPE's shared tables left out: an independent count of the activations."""
    layer = build_causal_lm(SPEC, seed=0).model.layers[0]
    hidden = torch.randn(2, 32, 64, requires_grad=True)
    rotary = rotary_cos_sin(torch.arange(32).expand(2, 32), SPEC.rotary_dim, SPEC.rope_theta, hidden.dtype)
    skipped = {t.untyped_storage().data_ptr() for t in (*layer.parameters(), *rotary)}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.untyped_storage().data_ptr() not in skipped:
            storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        layer(hidden, rotary)
    return sum(storages.values())


def test_activations_match_what_autograd_saves_within_two_percent():
    widths = LayerWidths(**model_family(SPEC).layer_widths())
    planned = _plan(_dims(), work=Workload(2, 32, 1))[0].activations / SPEC.num_layers
    measured = _saved_layer_bytes()
    assert abs(planned - measured) <= 0.02 * measured, (planned, measured, widths)


def test_recompute_and_sequence_parallelism_shrink_the_activations_as_counted():
    work = Workload(2, 32, 1)
    plain = _plan(_dims(), work=work)[0].activations
    full = _plan(_dims(), Layout(recompute="full"), work=work)[0].activations
    tokens = 2 * 32
    assert full == 4 * tokens * (4 * 64) + plain // 4  # each layer's input, plus one layer recomputed
    tp = _plan(_dims(tp=2), work=work)[0].activations
    sp = _plan(_dims(tp=2), Layout(sequence_parallel=True), work=work)[0].activations
    assert tp - sp == 4 * tokens * 4 * (2 * 64 // 2)  # the norm inputs split over the two ranks
    assert _plan(_dims(cp=2), work=work)[0].activations == plain // 2
    first, last = _plan(_dims(pp=2), work=Workload(2, 32, 4))
    assert first.activations == 2 * last.activations  # 1F1B: the first stage holds two micro-batches in flight
    assert first.loss == 0 and last.loss == tokens * 128 * (4 + 12)
    assert GIB == 2**30


def test_experts_split_over_expert_and_tensor_parallel_ranks_as_counted():
    from dataclasses import replace

    from nxd_models import MoESpec

    spec = replace(SPEC, moe=MoESpec(num_experts=4, top_k=2))
    family = model_family(spec)
    meta = family.build_on_meta()

    def plan(sizes: ParallelDims, zero1: bool = False) -> int:
        return memory_plan(
            meta,
            family.tp_plan(),
            pipeline_ranges(family, meta, Layout(), 1),
            LayerWidths(**family.layer_widths()),
            sizes=sizes,
            state=FP32,
            work=Workload(2, 32, 4),
            zero1=zero1,
            sequence_parallel=False,
            kv_replicator=1,
            recompute=None,
        )[0].parameters

    # per layer: norms, attention as above, a router 4 x 64 and 4 experts of gate/up/down 3 x 96 x 64
    experts, dense = 4 * 4 * 3 * 96 * 64, 4 * (2 * 64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 + 4 * 64) + EMBED + OUTPUT + 64
    assert plan(_dims()) == 4 * (dense + experts)
    # ep2 (of dp 2): half the experts on each rank, the rest whole
    assert plan(_dims(dp=2, ep=2)) == 4 * (dense + experts // 2)
    # ep2 x tp2: the experts' ffn halves too; the tensor-parallel weights (attention, embedding, output) halve
    norms_router = 4 * (2 * 64 + 4 * 64) + 64
    assert plan(_dims(dp=2, ep=2, tp=2)) == 4 * ((dense - norms_router) // 2 + norms_router + experts // 4)
    # ZeRO-1 over dp 4 with ep 2: dense values over 4 ranks, experts (half per rank) over the 2 holding them,
    # plus the gathered copy FSDP2 computes with
    assert plan(_dims(dp=4, ep=2), zero1=True) == 4 * (dense // 4 + experts // 2 // 2) + 4 * (dense + experts // 2)
