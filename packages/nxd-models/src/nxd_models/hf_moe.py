"""Mixtral in the Hugging Face family: transformers' MixtralForCausalLM with nxd's MoE layer in place of
each decoder layer's sparse MLP block, as NxDT puts NeuronX Distributed's MoE module there.

The `model.moe` keys (or, without a moe block, config.json's own routing: softmax top-k over
`num_local_experts`, normalised, dropless) describe that layer (`MoESpec`); the choice travels with
the config (`MOE_SPEC`, never exported). The layer holds the router as `mlp.router` and the experts
stacked (`mlp.experts.gate_proj` ...); on disk a Mixtral keeps the Hugging Face hub layout,
`block_sparse_moe.gate` and one `experts.N.w1/w2/w3` per expert (`mixtral_keys`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from torch import nn

from .errors import ModelConfigError
from .moe import MoELayer, MoESpec

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

MOE_SPEC = "nxd_moe"
EXPERT_WEIGHTS = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
"""Our stacked expert weight -> the hub's per-expert Linear (Mixtral's w1 gate, w3 up, w2 down)."""


def set_moe(config: PretrainedConfig, moe: MoESpec | None, source: str) -> None:
    """Apply the `model.moe` block to a config.json's config (`source` names it in errors): a Mixtral's
    experts and routing become those of `moe`, written into the config's own keys for export too."""
    if config.model_type != "mixtral":
        if moe is not None:
            raise ModelConfigError(
                f"model.moe: a Hugging Face model takes a moe block only when {source} is a "
                f"Mixtral (model_type mixtral), found {config.model_type!r}"
            )
        return
    if moe is None:
        moe = MoESpec(
            num_experts=config.num_local_experts,
            top_k=config.num_experts_per_tok,
            normalize_top_k_affinities=True,
            router_aux_loss=bool(config.output_router_logits),
            router_aux_loss_coef=config.router_aux_loss_coef if config.output_router_logits else 0.0,
        )
    if moe.frequency != 1:
        raise ModelConfigError(
            f"model.moe.frequency: expected 1 (a Mixtral has experts in every layer), found {moe.frequency}"
        )
    config.num_local_experts, config.num_experts_per_tok = moe.num_experts, moe.top_k
    config.output_router_logits, config.router_aux_loss_coef = moe.router_aux_loss, moe.router_aux_loss_coef
    setattr(config, MOE_SPEC, dataclasses.asdict(moe))


def moe_of(config: PretrainedConfig) -> MoESpec | None:
    """The MoE layer a config's model holds (None: a dense model)."""
    recorded = getattr(config, MOE_SPEC, None)
    return None if recorded is None else MoESpec(**recorded)


def use_moe_layers(model: PreTrainedModel) -> None:
    """Replace each decoder layer's sparse MLP block by nxd's MoE layer (on the model's device, meta
    included); transformers' own router-logit recording and auxiliary loss are turned off."""
    spec = moe_of(model.config)
    if spec is None:
        return
    from transformers.activations import ACT2FN

    config = model.config
    config.output_router_logits = False  # nxd's layer computes and weighs the load-balancing loss
    layers = model.model.layers
    for index, layer in enumerate(layers):
        device = next(layer.mlp.parameters()).device
        with device:
            layer.mlp = MoELayer(
                spec,
                config.hidden_size,
                config.intermediate_size,
                ACT2FN[config.hidden_act],
                gated=True,
                moe_index=index,
                moe_layer_count=len(layers),
            )


def init_experts(module: nn.Module, std: float) -> None:
    """transformers' Mixtral initialisation of expert weights: normal with the initializer range."""
    for parameter in module.parameters(recurse=False):
        nn.init.normal_(parameter, 0.0, std)


def mixtral_keys(layers: list[int], num_experts: int) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """Our MoE layers' keys (layers `layers`) in the hub's Mixtral layout: the router's key, and each
    stacked expert weight's per-expert keys (its first dimension, in order)."""
    keys, stacked = {}, {}
    for index in layers:
        ours, theirs = f"model.layers.{index}.mlp", f"model.layers.{index}.block_sparse_moe"
        keys[f"{ours}.router.weight"] = f"{theirs}.gate.weight"
        for name, hub in EXPERT_WEIGHTS.items():
            stacked[f"{ours}.experts.{name}"] = tuple(
                f"{theirs}.experts.{expert}.{hub}.weight" for expert in range(num_experts)
            )
    return keys, stacked
