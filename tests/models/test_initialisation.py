"""Module-by-module seeded initialisation: a value depends on the seed and its module's name only, so a
process initialising part of a model gets a whole build's values, holding one module at a time."""

from __future__ import annotations

import pytest
import torch
from nxd_align import LoraFamily, LoraSpec
from nxd_models import GPTConfig, build_causal_lm, init_rule, initial_values, model_family
from nxd_models.hf_qkv import set_qkv_linear
from transformers import LlamaConfig


def _spec(family: str, qkv: str | None = None) -> GPTConfig | LlamaConfig:
    if family == "megatron":
        return GPTConfig(
            vocab_size=64,
            num_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            num_kv_heads=2,
            seq_length=16,
            ffn_hidden_size=48,
            normalization="rmsnorm",
            activation="swiglu",
            position_embedding_type="rope",
            qkv_linear=qkv is not None,
            fuse_qkv=qkv == "fused",
            share_embeddings_and_output_weights=True,
        )
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
    )
    set_qkv_linear(config, qkv is not None, qkv == "fused")
    return config


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters()) | dict(model.named_buffers())


@pytest.mark.parametrize("family", ["megatron", "hf"])
def test_a_part_of_the_model_gets_the_whole_builds_values_one_module_at_a_time(family):
    spec = _spec(family)
    whole = _tensors(build_causal_lm(spec, seed=9))
    part = {"model.layers.1.mlp.down_proj.weight", "model.norm.weight", "model.layers.0.self_attn.k_proj.weight"}
    meta = model_family(spec).build_on_meta()
    yielded, rng = set(), torch.get_rng_state()
    for name, value in initial_values(meta, init_rule(meta), seed=9, device=torch.device("cpu"), names=part):
        allocated = {key for key, tensor in _tensors(meta).items() if not tensor.is_meta}
        assert name in allocated and {key.rpartition(".")[0] for key in allocated} == {name.rpartition(".")[0]}
        assert torch.equal(value, whole[name]), name
        yielded.add(name)
    assert part <= yielded and all(name.rpartition(".")[0] in {p.rpartition(".")[0] for p in part} for name in yielded)
    assert torch.equal(torch.get_rng_state(), rng)  # the caller's random stream is untouched
    assert all(tensor.is_meta for tensor in _tensors(meta).values())


@pytest.mark.parametrize("family", ["megatron", "hf"])
def test_the_seed_decides_and_fusing_qkv_changes_no_value(family):
    plain = _tensors(build_causal_lm(_spec(family), seed=4))
    again = _tensors(build_causal_lm(_spec(family), seed=4))
    other = _tensors(build_causal_lm(_spec(family), seed=5))
    fused = _tensors(build_causal_lm(_spec(family, "fused"), seed=4))
    assert all(torch.equal(value, again[name]) for name, value in plain.items())
    assert not torch.equal(plain["model.layers.0.mlp.up_proj.weight"], other["model.layers.0.mlp.up_proj.weight"])
    for part in "qkv":
        assert torch.equal(
            fused[f"model.layers.1.self_attn.qkv_proj.weight_{part}"],
            plain[f"model.layers.1.self_attn.{part}_proj.weight"],
        )


def test_transformers_initialisation_keeps_its_distributions_and_ties():
    model = build_causal_lm(_spec("hf"), seed=3)
    std = model.config.initializer_range
    weights = torch.cat([model.model.layers[i].mlp.gate_proj.weight.flatten() for i in range(2)])
    assert abs(weights.std().item() - std) < 0.1 * std
    assert torch.equal(model.model.norm.weight, torch.ones(32))
    freq = 1.0 / (model.config.rope_parameters["rope_theta"] ** (torch.arange(0, 8, 2).float() / 8))
    assert torch.allclose(model.model.rotary_emb.inv_freq, freq)  # RoPE's frequencies, worked from the formula
    tied = build_causal_lm(_spec("megatron"), seed=3)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight


def test_adapted_models_keep_the_base_values_of_the_same_seed():
    base = model_family(_spec("megatron", "fused"))
    lora = LoraFamily(base, LoraSpec(rank=4, alpha=8, targets=("qkv_proj", "down_proj")))
    plain, adapted = _tensors(base.build(seed=6)), _tensors(lora.build(seed=6))
    assert torch.equal(
        adapted["model.layers.0.mlp.down_proj.base_layer.weight"], plain["model.layers.0.mlp.down_proj.weight"]
    )
    assert torch.equal(
        adapted["model.layers.1.self_attn.qkv_proj.base_layer.weight_v"],
        plain["model.layers.1.self_attn.qkv_proj.weight_v"],
    )
    a, b = (
        adapted["model.layers.0.mlp.down_proj.lora_A.default.weight"],
        adapted["model.layers.0.mlp.down_proj.lora_B.default.weight"],
    )
    bound = 1 / a.shape[1] ** 0.5  # Kaiming-uniform with a = sqrt(5): U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert a.abs().max() <= bound and a.abs().max() > 0.5 * bound
    assert not b.any()
    sharded = dict(lora.initial_values(seed=6, device=torch.device("cpu")))
    assert all(torch.equal(value, adapted[name]) for name, value in sharded.items())
