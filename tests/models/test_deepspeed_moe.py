"""DeepSpeed's MoE (GPT-NeoX's moe_type: deepspeed) against DeepSpeed's top1gating / top2gating written out from
deepspeed/moe/sharded_moe.py on the same logits and draws; PR-MoE's residual mix and the experts' GLU by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from nxd_models import GPTConfig, ModelConfigError, MoESpec, build_causal_lm
from nxd_models.deepspeed_gating import deepspeed_capacity, deepspeed_gate
from nxd_models.moe import MoELayer, expert_capacity, load_balancing_loss


def _capacity(tokens: int, experts: int, factor: float, min_capacity: int) -> int:
    """sharded_moe._capacity."""
    capacity = math.ceil((tokens / experts) * factor)
    return max(capacity, min_capacity)


def _top1gating(logits, capacity_factor, min_capacity, drop_tokens, uniform):
    """sharded_moe.top1gating (use_rts with the given U(0, 1) draws; no noisy gate, no used_token), the combine
    weights summed over the capacity slots."""
    gates = F.softmax(logits, dim=1)
    capacity = _capacity(logits.shape[0], logits.shape[1], capacity_factor, min_capacity)
    indices1_s = torch.argmax(gates, dim=1)
    mask1 = F.one_hot(indices1_s, num_classes=logits.shape[1])
    exp_counts = torch.sum(mask1, dim=0)
    if not drop_tokens:
        capacity = min(int(exp_counts.max()), mask1.size(0))
    me = torch.mean(gates, dim=0)
    ce = torch.mean(mask1.float(), dim=0)
    l_aux = torch.sum(me * ce) * logits.shape[1]
    mask1_rand = mask1 * uniform
    top_idx = torch.topk(mask1_rand, k=capacity, dim=0)[1]
    mask1 = mask1 * torch.zeros_like(mask1).scatter_(0, top_idx, 1)
    return l_aux, gates * mask1.float()


def _top2gating(logits, capacity_factor, min_capacity, drop_tokens, gumbel):
    """sharded_moe.top2gating (top2_2nd_expert_sampling with the given Gumbel noise)."""
    gates = F.softmax(logits, dim=1)
    indices1_s = torch.argmax(gates, dim=1)
    num_experts = int(gates.shape[1])
    mask1 = F.one_hot(indices1_s, num_classes=num_experts)
    logits_w_noise = logits + gumbel
    logits_except1 = logits_w_noise.masked_fill(mask1.bool(), float("-inf"))
    indices2_s = torch.argmax(logits_except1, dim=1)
    mask2 = F.one_hot(indices2_s, num_classes=num_experts)
    locations1 = torch.cumsum(mask1, dim=0) - 1
    locations2 = torch.cumsum(mask2, dim=0) - 1
    locations2 += torch.sum(mask1, dim=0, keepdim=True)
    me = torch.mean(gates, dim=0)
    ce = torch.mean(mask1.float(), dim=0)
    l_aux = torch.mean(me * ce) * num_experts * num_experts
    if drop_tokens:
        capacity = _capacity(logits.shape[0], num_experts, capacity_factor * 2, min_capacity)
        mask1 *= torch.lt(locations1, capacity)
        mask2 *= torch.lt(locations2, capacity)
    mask1_float, mask2_float = mask1.float(), mask2.float()
    gates1_s = torch.einsum("se,se->s", gates, mask1_float)
    gates2_s = torch.einsum("se,se->s", gates, mask2_float)
    denom_s = torch.clamp(gates1_s + gates2_s, min=torch.finfo(gates1_s.dtype).eps)
    gates1_s, gates2_s = gates1_s / denom_s, gates2_s / denom_s
    return l_aux, torch.einsum("s,se->se", gates1_s, mask1_float) + torch.einsum("s,se->se", gates2_s, mask2_float)


LOGITS = torch.randn(24, 4, generator=torch.Generator().manual_seed(7)) * 2
"""24 tokens over 4 experts, uneven enough that capacity 1.0 drops tokens."""


@pytest.mark.parametrize("drop", [True, False], ids=["capacity", "dropless"])
def test_top1_is_deepspeeds_top1gating_with_random_token_selection(drop):
    torch.manual_seed(11)
    uniform = torch.rand(LOGITS.shape)
    l_aux, expected = _top1gating(LOGITS, 1.0, 4, drop, uniform)
    capacity = deepspeed_capacity(24, 4, 1, 1.0, 4) if drop else None
    torch.manual_seed(11)
    chosen, kept, weights = deepspeed_gate(LOGITS, 1, capacity, random_selection=True, sample_second=True)
    assert torch.allclose(weights, expected, atol=1e-7)
    assert drop == bool((chosen & ~kept).any())  # the capacity of 6 drops some of the busiest expert's tokens
    assert torch.allclose(load_balancing_loss(LOGITS, 1), l_aux, atol=1e-7)


@pytest.mark.parametrize("drop", [True, False], ids=["capacity", "dropless"])
def test_top2_is_deepspeeds_top2gating_with_a_sampled_second_expert(drop):
    torch.manual_seed(5)
    uniform = torch.rand(LOGITS.shape)
    gumbel = -torch.log(-torch.log(uniform))
    l_aux, expected = _top2gating(LOGITS, 0.5, 4, drop, gumbel)
    capacity = deepspeed_capacity(24, 4, 2, 0.5, 4) if drop else None
    torch.manual_seed(5)
    chosen, kept, weights = deepspeed_gate(LOGITS, 2, capacity, random_selection=True, sample_second=True)
    assert torch.allclose(weights, expected, atol=1e-6)
    assert drop == bool((chosen & ~kept).any())
    assert torch.allclose(load_balancing_loss(LOGITS, 1), l_aux, atol=1e-7)


def test_without_draws_top1_keeps_tokens_in_order_and_top2_takes_the_second_logit():
    capacity = 2
    chosen, kept, weights = deepspeed_gate(LOGITS, 1, capacity, random_selection=False, sample_second=False)
    order = torch.cumsum(chosen.long(), 0)
    assert torch.equal(kept, chosen & (order <= capacity))
    _, expected = _top2gating(LOGITS, 1.0, 0, False, torch.zeros_like(LOGITS))
    assert torch.allclose(deepspeed_gate(LOGITS, 2, None, random_selection=False, sample_second=False)[2], expected)


def test_capacity_is_deepspeeds_with_its_minimum_and_evaluation_factor():
    assert deepspeed_capacity(10, 4, 1, 1.0, 0) == 3  # ceil(2.5)
    assert deepspeed_capacity(10, 4, 2, 1.0, 0) == 5  # top-2 doubles the factor
    assert deepspeed_capacity(10, 4, 1, 1.0, 4) == 4  # min_capacity
    spec = MoESpec(num_experts=4, routing="deepspeed", capacity_factor=1.0, eval_capacity_factor=2.0, min_capacity=1)
    assert expert_capacity(10, spec, training=True) == 3 and expert_capacity(10, spec, training=False) == 5


def test_pr_moe_mixes_the_experts_and_the_dense_mlp_per_token():
    config = GPTConfig(
        vocab_size=64,
        num_layers=1,
        hidden_size=16,
        num_attention_heads=2,
        seq_length=8,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        activation="gelu",
        moe=MoESpec(num_experts=4, routing="deepspeed", residual=True, glu=True),
    )
    layer = build_causal_lm(config, seed=0).model.layers[0].mlp
    assert isinstance(layer, MoELayer) and layer.experts.gated  # moe_glu: gelu(gate(x)) * up(x)
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        tokens = x.reshape(-1, 16)
        gates = torch.softmax(tokens @ layer.router.weight.T, -1)
        expert = gates.argmax(-1)
        experts = torch.stack(
            [
                F.gelu(t @ layer.experts.gate_proj[e].T)
                * (t @ layer.experts.up_proj[e].T)
                @ layer.experts.down_proj[e].T
                for t, e in zip(tokens, expert, strict=True)
            ]
        )
        moe = experts * gates.gather(1, expert[:, None])
        mlp = layer.residual_mlp
        dense = F.gelu(tokens @ mlp.up_proj.weight.T + mlp.up_proj.bias) @ mlp.down_proj.weight.T + mlp.down_proj.bias
        mix = torch.softmax(tokens @ layer.coefficient.weight.T + layer.coefficient.bias, -1)
        by_hand = moe * mix[:, :1] + dense * mix[:, 1:]
        assert torch.allclose(layer.eval()(x).reshape(-1, 16), by_hand, atol=1e-6)
    bound = 16**-0.5  # torch's default draw of DeepSpeed's coefficient layer: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert layer.coefficient.weight.abs().max() <= bound and layer.coefficient.bias.abs().max() <= bound


def test_activation_recompute_replays_the_draws():
    config = GPTConfig(
        vocab_size=64,
        num_layers=2,
        hidden_size=16,
        num_attention_heads=2,
        seq_length=16,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        moe=MoESpec(
            num_experts=4,
            top_k=1,
            routing="deepspeed",
            capacity_factor=0.5,
            router_aux_loss=True,
            router_aux_loss_coef=0.1,
        ),
    )
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    grads = []
    for recompute in (False, True):
        model = build_causal_lm(config, seed=0)
        if recompute:
            from torch.utils.checkpoint import checkpoint

            for layer in model.model.layers:
                layer.forward = (lambda f: lambda *a, **k: checkpoint(f, *a, use_reentrant=False, **k))(layer.forward)
        torch.manual_seed(3)
        model(ids, labels=ids).mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert all(torch.allclose(grads[0][n], grads[1][n], atol=1e-6) for n in grads[0])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(top_k=3), "DeepSpeed's gate is top-1 or top-2"),
        (dict(router_activation="sigmoid"), "DeepSpeed's gate weighs by softmax"),
        (dict(normalize_top_k_affinities=True), "DeepSpeed's gate weighs by softmax"),
        (dict(min_capacity=-1), "min_capacity: expected 0 or more"),
    ],
)
def test_settings_deepspeeds_gate_lacks_are_named(changes, message):
    with pytest.raises(ModelConfigError, match=message):
        MoESpec(**{**dict(num_experts=4, routing="deepspeed"), **changes})


def test_a_pr_moe_model_claims_no_mixtral_export():
    from nxd_models.hf_mapping import hf_mapping

    config = GPTConfig(
        vocab_size=64,
        num_layers=1,
        hidden_size=16,
        num_attention_heads=2,
        seq_length=8,
        normalization="rmsnorm",
        activation="swiglu",
        has_bias=False,
        position_embedding_type="rope",
        moe=MoESpec(num_experts=4, top_k=2, normalize_top_k_affinities=True, residual=True),
    )
    with pytest.raises(ModelConfigError, match="moe.residual is True \\(Mixtral needs False\\)"):
        hf_mapping(config)
