"""The mixture-of-experts layer against independent references: transformers' MixtralForCausalLM for the
logits and its load_balancing_loss_func for the auxiliary loss; capacity drops and routing worked by hand."""

from __future__ import annotations

import math

import pytest
import torch
from nxd_models import GPTConfig, ModelConfigError, MoESpec, build_causal_lm
from nxd_models.moe import MoELayer, expert_capacity, load_balancing_loss, routing_metrics, take_routing_totals
from torch import nn
from transformers import MixtralConfig, MixtralForCausalLM
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

VOCAB, HIDDEN, FFN, EXPERTS = 96, 32, 48, 4


def _megatron(moe: MoESpec, layers: int = 2) -> GPTConfig:
    return GPTConfig(
        vocab_size=VOCAB,
        num_layers=layers,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        num_kv_heads=2,
        seq_length=16,
        ffn_hidden_size=FFN,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        normalization="rmsnorm",
        activation="swiglu",
        position_embedding_type="rope",
        has_bias=False,
        share_embeddings_and_output_weights=False,
        make_vocab_size_divisible_by=1,
        apply_query_key_layer_scaling=False,
        moe=moe,
    )


def _mixtral_state(ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict in transformers' Mixtral module layout (router -> gate, gate and up fused)."""
    theirs = {}
    for key, value in ours.items():
        if key.endswith("mlp.router.weight"):
            theirs[key.replace("mlp.router", "mlp.gate")] = value
        elif key.endswith("experts.gate_proj"):
            theirs[key.replace("gate_proj", "gate_up_proj")] = torch.cat([value, ours[key[:-9] + "up_proj"]], dim=1)
        elif not key.endswith("experts.up_proj"):
            theirs[key] = value
    return theirs


def test_dropless_megatron_moe_logits_equal_transformers_mixtral() -> None:
    spec = MoESpec(num_experts=EXPERTS, top_k=2, normalize_top_k_affinities=True)
    ours = build_causal_lm(_megatron(spec), seed=3).eval()
    config = MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=EXPERTS,
        num_experts_per_tok=2,
        rms_norm_eps=1e-5,
        max_position_embeddings=16,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    reference = MixtralForCausalLM(config).eval()
    reference.load_state_dict(_mixtral_state(ours.state_dict()), strict=True)
    tokens = torch.randint(0, VOCAB, (3, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(ours(tokens), reference(tokens).logits, atol=1e-5, rtol=0)


def _layer(spec: MoESpec, router: torch.Tensor) -> MoELayer:
    """An MoE layer (hidden 2) with the given router weight and every expert computing its input:
    up = identity, no gate (activation identity), down = identity."""
    layer = MoELayer(spec, 2, 2, lambda x: x, gated=False, moe_index=0, moe_layer_count=1)
    with torch.no_grad():
        layer.router.weight.copy_(router)
        layer.experts.up_proj.copy_(torch.eye(2).expand(spec.num_experts, 2, 2))
        layer.experts.down_proj.copy_(torch.eye(2).expand(spec.num_experts, 2, 2))
    return layer.train()


def test_capacity_drops_the_tokens_counted_by_hand() -> None:
    # two experts, top-1; a token (a, b) scores a against expert 0 and b against expert 1
    tokens = torch.tensor([[[3.0, 0.0], [2.0, 0.0], [4.0, 0.0], [1.0, 0.0], [5.0, 0.0], [0.0, 1.0]]])
    spec = MoESpec(num_experts=2, top_k=1, capacity_factor=1.0)
    # T = 6: capacity ceil(6 * 1 * 1.0 / 2) = 3. Expert 0 is chosen by tokens 0-4 (5 > 3: tokens 3 and 4,
    # the fourth and fifth in order, are dropped); expert 1 by token 5 (1 <= 3). Dropped: 2 of 6.
    assert expert_capacity(6, spec) == 3
    layer = _layer(spec, torch.eye(2))
    output = layer(tokens)
    affinity = torch.softmax(tokens[0], dim=-1)
    kept = torch.tensor([1.0, 1, 1, 0, 0, 1])
    expected = tokens[0] * (kept * affinity.max(dim=-1).values).unsqueeze(1)
    assert torch.allclose(output[0], expected, atol=1e-6)
    totals = take_routing_totals(layer)[0]
    assert float(totals.dropped) == 2.0 and totals.assigned.tolist() == [5.0, 1.0]
    metrics = routing_metrics({0: totals}, moe_layer_count=1, num_experts=2)
    # loads relative to the balanced share of 3: 5 / 3 and 1 / 3
    assert metrics["moe_dropped_fraction"] == pytest.approx(2 / 6)
    assert metrics["moe_expert_load_max"] == pytest.approx(5 / 3) and metrics["moe_expert_load_min"] == pytest.approx(
        1 / 3
    )


def test_top2_capacity_counts_each_tokens_choices_in_order() -> None:
    # four experts, top-2, T = 4: capacity ceil(4 * 2 * 0.5 / 4) = 1 per expert. Scores pick experts
    # {0, 1}, {0, 2}, {1, 3}, {0, 3}: expert 0 keeps token 0 (drops 1 and 3), expert 1 keeps token 0
    # (drops 2), expert 2 keeps token 1, expert 3 keeps token 2 (drops 3): 4 of 8 assignments dropped.
    tokens = torch.tensor([[[4.0, 3, 0, 0], [4, 0, 3, 0], [0, 4, 0, 3], [3, 0, 0, 4]]])
    spec = MoESpec(num_experts=4, top_k=2, capacity_factor=0.5, normalize_top_k_affinities=True)
    layer = MoELayer(spec, 4, 4, lambda x: x, gated=False, moe_index=0, moe_layer_count=1)
    with torch.no_grad():
        layer.router.weight.copy_(torch.eye(4))
        layer.experts.up_proj.copy_(torch.eye(4).expand(4, 4, 4))
        layer.experts.down_proj.copy_(torch.eye(4).expand(4, 4, 4))
    output = layer.train()(tokens)
    assert float(take_routing_totals(layer)[0].dropped) == 4.0
    # normalised over the kept experts: token 0 keeps both (weights sum to 1), tokens 1 and 2 keep one
    # (weight 1), token 3 keeps none (output 0)
    assert torch.allclose(output[0], tokens[0] * torch.tensor([1.0, 1.0, 1.0, 0.0]).unsqueeze(1), atol=1e-6)


def test_sigmoid_affinities_unnormalised_weigh_the_experts() -> None:
    tokens = torch.tensor([[[2.0, -1.0]]])
    layer = _layer(MoESpec(num_experts=2, top_k=2, router_activation="sigmoid"), torch.eye(2))
    weight = torch.sigmoid(torch.tensor(2.0)) + torch.sigmoid(torch.tensor(-1.0))  # both experts, each x
    assert torch.allclose(layer(tokens)[0, 0], tokens[0, 0] * weight, atol=1e-6)


def test_sinkhorn_balances_top1_routing_while_training() -> None:
    # every token prefers expert 0 a little: plain top-1 sends all there, Sinkhorn splits them evenly
    tokens = torch.tensor([[[1.0 + 0.01 * i, 1.0] for i in range(8)]])
    layer = _layer(MoESpec(num_experts=2, top_k=1, routing="sinkhorn"), torch.eye(2))
    layer(tokens)
    assert take_routing_totals(layer)[0].assigned.tolist() == [4.0, 4.0]
    layer.eval()(tokens)
    assert take_routing_totals(layer)[0].assigned is None  # evaluation records nothing


def test_load_balancing_loss_equals_transformers_over_top_k_and_the_formula() -> None:
    logits = torch.randn(10, EXPERTS, generator=torch.Generator().manual_seed(1))
    ours = load_balancing_loss(logits, top_k=2)
    # transformers' Mixtral loss is E * sum(f * P); NxD scales it by 1 / top_k so a balanced router gives 1
    assert ours.item() == pytest.approx(load_balancing_loss_func((logits,), EXPERTS, 2).item() / 2, abs=1e-6)
    # by hand for two tokens and two experts, top-1: probabilities (0.75, 0.25) and (0.5, 0.5) -> the first
    # token picks expert 0, the second expert 0 (a tie resolves to the first): f = (1, 0), P = (0.625, 0.375)
    two = torch.log(torch.tensor([[0.75, 0.25], [0.5, 0.5]]))
    assert load_balancing_loss(two, top_k=1).item() == pytest.approx(2 * (1 * 0.625 + 0 * 0.375))


def test_the_auxiliary_loss_reaches_the_router_gradient_with_its_weight() -> None:
    torch.manual_seed(0)
    spec = MoESpec(num_experts=EXPERTS, top_k=2, router_aux_loss=True, router_aux_loss_coef=0.1)
    layer = MoELayer(spec, HIDDEN, FFN, torch.nn.functional.silu, gated=True, moe_index=0, moe_layer_count=2)
    for parameter in layer.parameters():
        nn.init.normal_(parameter, std=0.2)
    tokens = torch.randn(2, 5, HIDDEN)
    layer.aux_loss_weight = 0.0
    layer(tokens).sum().backward()
    without = layer.router.weight.grad.clone()
    layer.zero_grad()
    logits = tokens.reshape(-1, HIDDEN) @ layer.router.weight.t()
    (0.37 * load_balancing_loss(logits, 2)).backward()
    aux_only = layer.router.weight.grad.clone()
    layer.zero_grad()
    layer.aux_loss_weight = 0.37
    layer(tokens).sum().backward()
    assert torch.allclose(layer.router.weight.grad, without + aux_only, atol=1e-6)


def test_moe_layers_sit_every_frequency_layers_counted_from_one() -> None:
    config = _megatron(MoESpec(num_experts=EXPERTS, frequency=2), layers=4)
    assert config.moe_layers == [1, 3]
    kinds = [type(layer.mlp).__name__ for layer in build_causal_lm(config, seed=1).model.layers]
    assert kinds == ["MLP", "MoELayer", "MLP", "MoELayer"]
    assert "model.layers.1.mlp" in build_causal_lm(config, seed=1).tp_plan()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"top_k": 5}, "model.moe.top_k: expected 1 to num_experts (4), found 5"),
        (
            {"top_k": 2, "routing": "sinkhorn"},
            "model.moe.routing_algorithm: sinkhorn balances top-1 routing only; expected top_k 1, found 2",
        ),
        (
            {"router_aux_loss_coef": 0.1},
            "model.moe.router_aux_loss_coef: the load-balancing loss is computed only "
            "with output_router_logits: True; found 0.1 with False",
        ),
    ],
)
def test_a_bad_moe_spec_names_its_key(changes: dict, message: str) -> None:
    with pytest.raises(ModelConfigError) as info:
        MoESpec(num_experts=EXPERTS, **changes)
    assert str(info.value) == message


def test_capacity_never_exceeds_the_tokens() -> None:
    spec = MoESpec(num_experts=2, top_k=2, capacity_factor=4.0)
    assert expert_capacity(10, spec) == 10 and expert_capacity(10, MoESpec(num_experts=2)) is None
    assert expert_capacity(7, MoESpec(num_experts=4, top_k=2, capacity_factor=1.0)) == math.ceil(7 * 2 / 4)


def test_jitter_scales_the_routers_input_by_uniform_noise_while_training_only() -> None:
    """GPT-NeoX's TopKTokenChoiceRouter.jitter: x * (low + U[0, 1) * (high - low)), low = 1 - eps, high = 1 + eps;
    the experts read the unjittered tokens."""
    eps = 0.1
    layer = _layer(MoESpec(num_experts=4, top_k=2, jitter_eps=eps), torch.randn(4, 2, generator=_seeded(1)))
    seen = []
    layer.router.register_forward_hook(lambda module, args, out: seen.append(args[0].detach().clone()))
    tokens = torch.randn(2, 3, 2, generator=_seeded(2))
    torch.manual_seed(7)
    layer.train()(tokens)
    torch.manual_seed(7)
    noise = torch.rand(6, 2)
    assert torch.allclose(seen[0], tokens.reshape(6, 2) * ((1 - eps) + noise * ((1 + eps) - (1 - eps))), atol=1e-7)
    ratio = seen[0] / tokens.reshape(6, 2)
    assert ratio.min() >= 1 - eps and ratio.max() < 1 + eps and not torch.allclose(ratio, torch.ones(6, 2))
    layer.eval()(tokens)
    assert torch.equal(seen[1], tokens.reshape(6, 2))


def test_a_recomputed_jittered_layer_replays_the_forwards_noise() -> None:
    """nxd-parallel's activation checkpointing (torch's composable checkpoint) restores the generator's state for
    the replay, so the recomputed routing is the forward's."""
    from nxd_parallel.activation_checkpointing import apply_activation_checkpointing

    grads = []
    for recompute in (False, True):
        layer = _layer(MoESpec(num_experts=4, top_k=2, jitter_eps=0.3), torch.randn(4, 2, generator=_seeded(1)))
        tokens = torch.randn(2, 5, 2, generator=_seeded(2), requires_grad=True)
        if recompute:
            apply_activation_checkpointing([layer])
        torch.manual_seed(3)
        layer(tokens).square().sum().backward()
        grads.append((tokens.grad, layer.router.weight.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _neox_sinkhorn_by_hand(logits: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX's SinkhornRouter.sinkhorn (megatron/model/router.py), written out: tol 1e-4, at most 3 iterations."""
    cost = torch.exp(logits)
    d0 = torch.ones(cost.size(0))
    d1 = 1 / (cost.size(1) * torch.sum(cost, 0))
    d1_old = d1
    for _ in range(3):
        d0 = (1 / d0.size(0)) * 1 / (torch.sum(d1 * cost, 1) + 0.00000001)
        d1 = (1 / d1.size(0)) * 1 / (torch.sum(d0.unsqueeze(1) * cost, 0) + 0.00000001)
        error = torch.mean(torch.abs(d1_old - d1))
        d1_old = d1
        if error < 0.0001:
            break
    return d1 * cost * d0.unsqueeze(1)


@pytest.mark.parametrize(("top_k", "activation"), [(1, "sigmoid"), (2, "softmax")])
def test_neox_sinkhorn_routes_the_balanced_top_k_and_weighs_by_the_plain_affinities(top_k, activation) -> None:
    from nxd_models.moe import neox_sinkhorn

    logits = torch.randn(12, 4, generator=_seeded(5)) * 3
    assert torch.allclose(neox_sinkhorn(logits), _neox_sinkhorn_by_hand(logits), rtol=1e-6)
    layer = _layer(
        MoESpec(num_experts=4, top_k=top_k, routing="neox_sinkhorn", router_activation=activation), torch.zeros(4, 2)
    )
    chosen, kept, weights = layer.train()._route(logits)
    expected = torch.topk(_neox_sinkhorn_by_hand(logits), top_k, dim=-1).indices
    assert torch.equal(chosen, torch.zeros_like(chosen).scatter_(1, expected, True)) and torch.equal(kept, chosen)
    scores = torch.sigmoid(logits) if top_k == 1 else torch.softmax(logits, -1)
    assert torch.allclose(weights, scores.masked_fill(~chosen, 0.0))
    plain = layer.eval()._route(logits)[0]  # evaluation: the plain top-k of the affinities
    assert torch.equal(plain, torch.zeros_like(chosen).scatter_(1, torch.topk(scores, top_k, -1).indices, True))
    assert not torch.equal(plain, chosen)  # the balancing moved some tokens
