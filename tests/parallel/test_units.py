"""nxd-parallel's pieces in one process, against values worked by hand."""

from __future__ import annotations

import math

import pytest
import torch
from nxd_models import AttentionKernel, build_causal_lm
from nxd_parallel import ParallelConfigError, ParallelDims, check_plan, clip_gradients, global_norm
from nxd_parallel.activation_checkpointing import apply_activation_checkpointing
from nxd_parallel.kv_replication import replicated_heads

from .parity import model_spec


def test_data_parallel_size_is_what_the_model_parallel_degrees_leave():
    dims = ParallelDims(16, tp=2, pp=2, cp=2)
    assert dims.dp == 2
    assert dims.sizes() == {"pp": 2, "dp": 2, "cp": 2, "tp": 2}


def test_a_layout_that_does_not_fit_the_world_is_refused():
    with pytest.raises(ParallelConfigError) as caught:
        ParallelDims(6, tp=4)
    assert str(caught.value) == "tp * pp * cp = 4 * 1 * 1 = 4: expected a divisor of the world size 6"


def test_one_process_has_no_mesh_and_rank_zero_everywhere():
    mesh = ParallelDims(1).build_mesh("cpu")
    assert mesh.mesh is None and mesh.get("tp") is None and mesh.get("dp_cp") is None
    assert mesh.data_parallel_rank == 0


@pytest.mark.parametrize(
    ("heads", "copies", "tp", "expected"),
    [
        (1, 2, 2, [[0], [0]]),  # one KV head, both ranks compute it
        (2, 2, 2, [[0, 0], [1, 1]]),  # each rank its own head (twice)
        (2, 4, 8, [[0], [0], [0], [0], [1], [1], [1], [1]]),
        (4, 1, 2, [[0, 1], [2, 3]]),  # no replication: plain column split
    ],
)
def test_each_rank_gets_the_kv_heads_its_query_heads_use(heads, copies, tp, expected):
    assert [replicated_heads(heads, copies, tp, rank) for rank in range(tp)] == expected


def test_kv_copies_must_split_evenly_over_tp():
    with pytest.raises(
        ParallelConfigError, match="1 KV heads x 1 copies = 1; expected a multiple of the tensor-parallel size 2"
    ):
        replicated_heads(1, 1, 2, 0)


def test_a_plan_naming_a_missing_module_or_an_unknown_style_is_reported():
    model = build_causal_lm(model_spec("megatron"))
    problems = check_plan(model, {"model.layers.*.self_attn.qkv": "colwise", "lm_head": "diagonal"})
    assert problems == [
        "TP plan 'lm_head': style 'diagonal' is not one of colwise, colwise_kv, qkv, rowwise, vocab, colwise_output, score, "
        "sequence, heads, replicated_with_grad_allreduce, moe, lora_a_colwise, lora_b_colwise, lora_b_colwise_kv, "
        "lora_a_rowwise, lora_b_rowwise",
        "TP plan 'model.layers.*.self_attn.qkv': names no module of GPTForCausalLM",
    ]


def test_global_norm_of_plain_tensors_is_the_l2_norm():
    assert global_norm([torch.tensor([3.0]), torch.tensor([[4.0]])]).item() == 5.0


def test_global_norm_of_large_tensors_sums_in_fp64():
    # more elements than one part, one of them a transposed (non-contiguous) view; fp32 accumulation
    # over 2**21 values of this size drifts far beyond 1e-12
    generator = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(2**21 + 5, generator=generator) * 1e3,
        torch.randn(700, 600, generator=generator).t(),
        torch.randn(3, generator=generator).bfloat16(),
    ]
    by_hand = math.sqrt(sum((t.double() ** 2).sum().item() for t in tensors))
    assert math.isclose(global_norm(tensors).item(), by_hand, rel_tol=1e-12)


def test_clipping_scales_gradients_to_the_limit_as_torch_does():
    weights = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))]
    weights[0].grad, weights[1].grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])
    norm = clip_gradients(weights, 1.0)
    assert norm.item() == 5.0
    scale = 1.0 / (5.0 + 1e-6)
    assert torch.allclose(weights[0].grad, torch.tensor([3.0 * scale, 0.0]))
    assert math.isclose(weights[1].grad.item(), 4.0 * scale, rel_tol=1e-6)


def _saved_bytes(model: torch.nn.Module) -> int:
    saved = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(ids).sum()
    loss.backward()
    return sum(saved)


def test_full_recomputation_keeps_fewer_activations_and_the_same_gradients():
    plain = build_causal_lm(model_spec("megatron"), attention=AttentionKernel.FLASH)
    recomputed = build_causal_lm(model_spec("megatron"), attention=AttentionKernel.FLASH)
    recomputed.load_state_dict(plain.state_dict())
    assert apply_activation_checkpointing(recomputed.model.layers) == 2
    kept, kept_recomputed = _saved_bytes(plain), _saved_bytes(recomputed)
    assert kept_recomputed < kept / 2, (kept_recomputed, kept)
    for (name, a), b in zip(plain.named_parameters(), recomputed.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-7), name


def test_pipeline_cuts_end_the_named_layers():
    from nxd_parallel.pipeline import stage_ranges

    assert stage_ranges(30, 3, cuts=[9, 19]) == [range(0, 10), range(10, 20), range(20, 30)]  # NxD's create_partition
    with pytest.raises(ParallelConfigError, match="strictly increasing"):
        stage_ranges(8, 3, cuts=[5, 2])
    with pytest.raises(ParallelConfigError, match="expected 2 cut"):
        stage_ranges(8, 3, cuts=[2])


def test_balanced_stages_count_the_embedding_and_output_layer():
    from nxd_parallel.pipeline import rank_stages, stage_ranges

    assert stage_ranges(8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert stage_ranges(5, 2) == [range(0, 2), range(2, 5)]  # the odd layer goes to the later stage
    # embeddings worth two layers, the output layer one: 13 units over 4 stages cost at least 4 on one of
    # them; the first stage takes one layer (1 + 2), the last three (3 + 1)
    assert stage_ranges(10, 4, first_cost=2.0, last_cost=1.0) == [range(0, 1), range(1, 4), range(4, 7), range(7, 10)]
    assert rank_stages(1, 2, 2) == [1, 3]
