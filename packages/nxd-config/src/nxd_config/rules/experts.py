"""model.moe: mixture-of-experts layers, their routing and their layout."""

from __future__ import annotations

from collections.abc import Iterator

from ..schema import NxdConfig
from .findings import CP, DEVICES, NODES, PP, TP, Finding, error, notice


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
