"""Megatron-style decoder: config checks, attention paths, dropout, init, vocabulary padding, FLOPs."""

from __future__ import annotations

import fnmatch
import math

import pytest
import torch
from nxd_models import AttentionKernel, GPTConfig, ModelConfigError, build_causal_lm
from nxd_models.flops import training_flops_per_token

BASE = dict(
    vocab_size=300,
    num_layers=4,
    hidden_size=32,
    num_attention_heads=4,
    seq_length=16,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)


def _config(**changes) -> GPTConfig:
    return GPTConfig(**{**BASE, **changes})


@pytest.mark.parametrize(
    ("vocab", "divisible_by", "tp", "padded"),
    [(300, 128, 1, 384), (50257, 128, 1, 50304), (1000, 128, 2, 1024), (256, 128, 1, 256)],
)
def test_vocabulary_is_padded_as_megatron_pads_it(vocab, divisible_by, tp, padded):
    config = _config(vocab_size=vocab, make_vocab_size_divisible_by=divisible_by, tensor_parallel_size=tp)
    assert config.padded_vocab_size == padded


@pytest.mark.parametrize("rope", ["rope", "learned_absolute"])
@pytest.mark.parametrize("scaling", [True, False])
def test_unfused_core_attention_equals_sdpa(rope, scaling):
    """Query-key layer scaling divides scores by the layer number and multiplies back in the fp32
    softmax: in fp32 the unfused path must equal the fused kernels."""
    torch.manual_seed(0)
    models = {}
    for name, kernel in {
        "unfused": AttentionKernel.UNFUSED,
        "softmax": AttentionKernel.FUSED_SOFTMAX,
        "flash": AttentionKernel.FLASH,
    }.items():
        torch.manual_seed(0)
        config = _config(position_embedding_type=rope, num_kv_heads=2, apply_query_key_layer_scaling=scaling)
        models[name] = build_causal_lm(config, attention=kernel).eval()
    input_ids = torch.randint(0, 300, (2, 16))
    with torch.no_grad():
        logits = {name: model(input_ids) for name, model in models.items()}
    assert (logits["unfused"] - logits["softmax"]).abs().max() < 1e-6
    assert (logits["unfused"] - logits["flash"]).abs().max() < 1e-6


def test_attention_is_causal():
    model = build_causal_lm(_config()).eval()
    input_ids = torch.randint(0, 300, (1, 16))
    changed = input_ids.clone()
    changed[0, 10] = (changed[0, 10] + 1) % 300
    with torch.no_grad():
        before, after = model(input_ids), model(changed)
    assert torch.equal(before[0, :10], after[0, :10])
    assert not torch.allclose(before[0, 10:], after[0, 10:])


@pytest.mark.parametrize("key", ["hidden_dropout", "attention_dropout", "ffn_dropout"])
def test_each_dropout_is_active_in_training_only(key):
    model = build_causal_lm(_config(**{key: 0.5}))
    input_ids = torch.randint(0, 300, (2, 16))
    model.train()
    assert not torch.equal(model(input_ids), model(input_ids))
    model.eval()
    assert torch.equal(model(input_ids), model(input_ids))


def test_learned_positions_and_rope_both_see_position():
    for kind in ("learned_absolute", "rope"):
        model = build_causal_lm(_config(position_embedding_type=kind, max_position_embeddings=64)).eval()
        input_ids = torch.randint(0, 300, (1, 16))
        with torch.no_grad():
            shifted = model(input_ids, torch.arange(16, 32)[None])
            plain = model(input_ids)
        assert not torch.allclose(plain, shifted), kind
    assert model.model.embed_tokens.weight.shape[0] == 384
    assert not hasattr(model.model, "position_embeddings")
    learned = build_causal_lm(_config(max_position_embeddings=64))
    assert learned.model.position_embeddings.weight.shape == (64, 32)


def test_init_follows_megatron():
    torch.manual_seed(0)
    config = _config(
        num_layers=8,
        hidden_size=256,
        num_attention_heads=4,
        vocab_size=4096,
        has_bias=True,
        init_method_std=0.02,
        share_embeddings_and_output_weights=False,
    )
    model = build_causal_lm(config)
    scaled = 0.02 / math.sqrt(2 * 8)
    layer = model.model.layers[0]
    assert layer.self_attn.q_proj.weight.std().item() == pytest.approx(0.02, rel=0.03)
    assert layer.self_attn.o_proj.weight.std().item() == pytest.approx(scaled, rel=0.03)
    assert layer.mlp.down_proj.weight.std().item() == pytest.approx(scaled, rel=0.03)
    assert model.lm_head.weight.std().item() == pytest.approx(0.02, rel=0.03)
    assert torch.all(layer.self_attn.q_proj.bias == 0) and torch.all(layer.input_layernorm.weight == 1)
    unscaled = build_causal_lm(_config(num_layers=8, hidden_size=256, use_scaled_init_method=False))
    assert unscaled.model.layers[0].self_attn.o_proj.weight.std().item() == pytest.approx(0.02, rel=0.03)


def test_tied_output_layer_shares_the_embedding():
    model = build_causal_lm(_config(share_embeddings_and_output_weights=True))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.model.embed_tokens.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_swiglu_and_gelu_mlp_shapes():
    swiglu = build_causal_lm(_config(activation="swiglu", ffn_hidden_size=40)).model.layers[0].mlp
    gelu = build_causal_lm(_config(activation="gelu")).model.layers[0].mlp
    assert swiglu.gate_proj.weight.shape == (40, 32) and swiglu.down_proj.weight.shape == (32, 40)
    assert not hasattr(gelu, "gate_proj") and gelu.up_proj.weight.shape == (128, 32)  # 4 * hidden


def test_normalization_and_epsilon():
    rms = build_causal_lm(_config(normalization="rmsnorm", layernorm_epsilon=1e-6)).model.norm
    layer = build_causal_lm(_config(normalization="layernorm")).model.norm
    assert isinstance(rms, torch.nn.RMSNorm) and rms.eps == 1e-6
    assert isinstance(layer, torch.nn.LayerNorm) and layer.bias is not None


def test_flops_per_token_by_hand():
    config = _config(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        vocab_size=256,
        ffn_hidden_size=64,
        activation="swiglu",
        has_bias=False,
        share_embeddings_and_output_weights=False,
    )
    model = build_causal_lm(config)
    per_layer = 4 * 32 * 32 + 3 * 32 * 64  # q, k, v, o and gate, up, down
    weights = 2 * per_layer + 256 * 32  # plus the output layer
    assert training_flops_per_token(model, 16) == 6 * weights + 12 * 2 * 32 * 16


def test_tp_plan_patterns_name_real_modules():
    model = build_causal_lm(_config(activation="swiglu"))
    names = [name for name, _ in model.named_modules()]
    for pattern in model.tp_plan():
        assert fnmatch.filter(names, pattern), pattern


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"transformer_block_type": "post_ln"},
            "model.transformer_block_type: expected one of pre_ln, gpt_j, gpt_neox, found 'post_ln'",
        ),
        (
            {"position_embedding_type": "sinusoidal", "hidden_size": 25, "num_attention_heads": 5},
            "model.hidden_size: sinusoidal positions pair a sine with a cosine; expected an even width, found 25",
        ),
        ({"init_method": "kaiming"}, "model.init_method: expected one of normal, scaled_normal"),
        (
            {"seq_length": 128, "max_position_embeddings": 64},
            "model.encoder_seq_length: expected at most max_position_embeddings (64), found 128",
        ),
        ({"num_kv_heads": 3}, "model.num_kv_heads: expected a divisor of num_attention_heads (4), found 3"),
        (
            {"hidden_size": 30},
            "model.hidden_size: expected a multiple of num_attention_heads (4) when kv_channels is null, found 30",
        ),
    ],
)
def test_invalid_architectures_are_rejected_by_key(changes, message):
    with pytest.raises(ModelConfigError) as caught:
        _config(**changes)
    assert message in str(caught.value)


def test_hf_mapping_names_what_llama_cannot_hold():
    from nxd_models.hf_mapping import hf_mapping

    with pytest.raises(ModelConfigError) as caught:
        hf_mapping(_config(activation="geglu", normalization="scalenorm", position_embedding_type="rope"))
    assert caught.value.problems == [
        "no Hugging Face architecture matches this Megatron-style model: normalization is 'scalenorm' (Llama needs "
        "'rmsnorm'); activation is 'geglu' (Llama needs 'swiglu')"
    ]


def test_hf_mapping_names_what_gpt_neox_cannot_hold():
    from nxd_models.hf_mapping import hf_mapping

    with pytest.raises(ModelConfigError) as caught:
        hf_mapping(_config(activation="softsign", normalization="layernorm", position_embedding_type="alibi"))
    assert caught.value.problems == [
        "no Hugging Face architecture matches this Megatron-style model: position_embedding_type is 'alibi' (GPT-NeoX "
        "uses rope); activation is 'softsign' (GPT-NeoX's hidden_act takes approx-gelu, gelu, mish, relu, silu)"
    ]


def test_every_problem_is_reported_at_once():
    with pytest.raises(ModelConfigError) as caught:
        _config(transformer_block_type="post_ln", num_kv_heads=3)
    assert len(caught.value.problems) == 2


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "separate"])
def test_qkv_linear_computes_what_the_separate_projections_compute(fuse):
    """The one-module QKV projection (qkv_linear) draws its init in the q, k, v order of three
    Linear layers, so with the same seed the two models hold the same weights and logits."""
    config = _config(num_kv_heads=2, has_bias=True)
    torch.manual_seed(3)
    separate = build_causal_lm(config)
    torch.manual_seed(3)
    fused = build_causal_lm(_config(num_kv_heads=2, has_bias=True, qkv_linear=True, fuse_qkv=fuse))
    attention = fused.model.layers[0].self_attn.qkv_proj
    assert torch.equal(attention.weight_k, separate.model.layers[0].self_attn.k_proj.weight)
    input_ids = torch.randint(0, 300, (2, 16))
    torch.testing.assert_close(fused(input_ids), separate(input_ids), rtol=0, atol=1e-6)
    assert training_flops_per_token(fused, 16) == training_flops_per_token(separate, 16)
    names = [name for name, _ in fused.named_modules()]
    for pattern in fused.tp_plan():
        assert fnmatch.filter(names, pattern), pattern


def test_hf_mapping_of_a_qkv_linear_model_names_the_llama_projections():
    from nxd_models.hf_mapping import hf_mapping

    keys = hf_mapping(
        _config(
            activation="swiglu",
            normalization="rmsnorm",
            position_embedding_type="rope",
            has_bias=False,
            qkv_linear=True,
        )
    ).keys
    assert keys["model.layers.0.self_attn.qkv_proj.weight_q"] == "model.layers.0.self_attn.q_proj.weight"
    assert keys["model.layers.3.self_attn.qkv_proj.weight_v"] == "model.layers.3.self_attn.v_proj.weight"
