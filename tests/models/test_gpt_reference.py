"""The Megatron-style decoder against transformers' own implementations, loaded with the same weights."""

from __future__ import annotations

import pytest
import torch
from nxd_models import AttentionKernel, GPTConfig, build_causal_lm, causal_lm_logits
from nxd_models.hf_mapping import hf_mapping
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM

SEQ = 24


def _tokens(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, vocab, (2, SEQ), generator=generator)
    return input_ids, torch.arange(SEQ).expand(2, SEQ)


def _llama_shape(**changes) -> GPTConfig:
    base = dict(
        vocab_size=1000,
        num_layers=3,
        hidden_size=64,
        num_attention_heads=8,
        num_kv_heads=2,
        seq_length=SEQ,
        ffn_hidden_size=96,
        normalization="rmsnorm",
        activation="swiglu",
        position_embedding_type="rope",
        rope_theta=500000.0,
        has_bias=False,
        share_embeddings_and_output_weights=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        make_vocab_size_divisible_by=128,
    )
    return GPTConfig(**{**base, **changes})


@pytest.mark.parametrize(
    ("changes", "kernel"),
    [
        ({}, AttentionKernel.UNFUSED),
        ({"share_embeddings_and_output_weights": True}, AttentionKernel.UNFUSED),
        ({"has_bias": True, "num_kv_heads": 1}, AttentionKernel.UNFUSED),
        ({"kv_channels": 16, "num_kv_heads": 8}, AttentionKernel.UNFUSED),
        ({}, AttentionKernel.FLASH),
        ({"apply_query_key_layer_scaling": False}, AttentionKernel.FUSED_SOFTMAX),
    ],
    ids=["gqa", "tied", "bias-mqa", "kv-channels-mha", "flash", "fused-softmax"],
)
def test_llama_shape_matches_transformers_llama(changes, kernel):
    torch.manual_seed(0)
    config = _llama_shape(**changes)
    ours = build_causal_lm(config, attention=kernel).eval()
    mapping = hf_mapping(config)
    assert config.padded_vocab_size == 1024  # 1000 rounded up to a multiple of 128
    reference = LlamaForCausalLM(LlamaConfig(**mapping.config)).eval()
    state = ours.state_dict()
    hf_state = {}
    for our_key, hf_key in mapping.keys.items():
        tensor = state[our_key]
        hf_state[hf_key] = tensor[: config.vocab_size] if our_key in mapping.vocab_padded_keys else tensor
    missing, unexpected = reference.load_state_dict(hf_state, strict=False)
    assert not unexpected
    assert set(missing) <= ({"lm_head.weight"} if config.share_embeddings_and_output_weights else set())
    input_ids, positions = _tokens(config.vocab_size)
    with torch.no_grad():
        expected = reference(input_ids=input_ids, position_ids=positions).logits
        found = causal_lm_logits(ours, input_ids, positions)[..., : config.vocab_size]
    assert (found - expected).abs().max().item() < 1e-5


def test_gelu_layernorm_partial_rotary_matches_transformers_gpt_neox():
    """GPT-NeoX with a sequential residual is the Megatron GPT shape: layernorm, gelu MLP, biases and
    RoPE over a fraction of each head. Its fused QKV holds [q, k, v] per head."""
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=512,
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        seq_length=SEQ,
        ffn_hidden_size=128,
        normalization="layernorm",
        layernorm_epsilon=1e-5,
        activation="gelu",
        position_embedding_type="rope",
        rotary_percentage=0.25,
        rope_theta=10000.0,
        has_bias=True,
        share_embeddings_and_output_weights=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        make_vocab_size_divisible_by=128,
    )
    ours = build_causal_lm(config, attention=AttentionKernel.UNFUSED).eval()
    reference = GPTNeoXForCausalLM(
        GPTNeoXConfig(
            vocab_size=512,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            hidden_act="gelu",
            rotary_pct=0.25,
            rope_theta=10000.0,
            max_position_embeddings=SEQ,
            layer_norm_eps=1e-5,
            use_parallel_residual=False,
            tie_word_embeddings=False,
            attention_bias=True,
            hidden_dropout=0.0,
            attention_dropout=0.0,
        )
    ).eval()
    s = ours.state_dict()
    hf = {
        "gpt_neox.embed_in.weight": s["model.embed_tokens.weight"],
        "lm_head.weight": s["lm_head.weight"],
        "gpt_neox.final_layer_norm.weight": s["model.norm.weight"],
        "gpt_neox.final_layer_norm.bias": s["model.norm.bias"],
    }
    heads, head_dim = 4, 16
    for i in range(2):
        ours_prefix, theirs = f"model.layers.{i}.", f"gpt_neox.layers.{i}."
        for kind in ("weight", "bias"):
            q, k, v = (s[f"{ours_prefix}self_attn.{p}_proj.{kind}"] for p in "qkv")
            per_head = [t.reshape(heads, head_dim, *t.shape[1:]) for t in (q, k, v)]
            hf[f"{theirs}attention.query_key_value.{kind}"] = torch.stack(per_head, dim=1).reshape(3 * 64, *q.shape[1:])
            hf[f"{theirs}attention.dense.{kind}"] = s[f"{ours_prefix}self_attn.o_proj.{kind}"]
            hf[f"{theirs}mlp.dense_h_to_4h.{kind}"] = s[f"{ours_prefix}mlp.up_proj.{kind}"]
            hf[f"{theirs}mlp.dense_4h_to_h.{kind}"] = s[f"{ours_prefix}mlp.down_proj.{kind}"]
            hf[f"{theirs}input_layernorm.{kind}"] = s[f"{ours_prefix}input_layernorm.{kind}"]
            hf[f"{theirs}post_attention_layernorm.{kind}"] = s[f"{ours_prefix}post_attention_layernorm.{kind}"]
    hf = {
        key: (value[:512] if key in ("gpt_neox.embed_in.weight", "lm_head.weight") else value)
        for key, value in hf.items()
    }
    reference.load_state_dict(hf, strict=True)
    input_ids, positions = _tokens(512)
    with torch.no_grad():
        expected = reference(input_ids=input_ids, position_ids=positions).logits
        found = causal_lm_logits(ours, input_ids, positions)[..., :512]
    assert (found - expected).abs().max().item() < 1e-5


@pytest.mark.parametrize("kernel", [AttentionKernel.UNFUSED, AttentionKernel.FLASH])
def test_sliding_window_matches_transformers_mistral(kernel):
    """Megatron-style Mistral: a window shorter than the sequence, against MistralForCausalLM with the
    same window and weights; a window as long as the sequence is full causal attention."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = _llama_shape(sliding_window=7)
    ours = build_causal_lm(config, attention=kernel).eval()
    mapping = hf_mapping(config)
    assert mapping.config["architectures"] == ["MistralForCausalLM"] and mapping.config["sliding_window"] == 7
    reference = MistralForCausalLM(MistralConfig(**mapping.config)).eval()
    state = ours.state_dict()
    hf_state = {
        hf_key: state[our_key][: config.vocab_size] if our_key in mapping.vocab_padded_keys else state[our_key]
        for our_key, hf_key in mapping.keys.items()
    }
    missing, unexpected = reference.load_state_dict(hf_state, strict=False)
    assert not missing and not unexpected
    input_ids, positions = _tokens(config.vocab_size)
    with torch.no_grad():
        expected = reference(input_ids=input_ids, position_ids=positions).logits
        found = causal_lm_logits(ours, input_ids, positions)[..., : config.vocab_size]
        full = build_causal_lm(_llama_shape(sliding_window=SEQ), attention=kernel).eval()
        full.load_state_dict(state)
        causal = build_causal_lm(_llama_shape(), attention=kernel).eval()
        causal.load_state_dict(state)
        same = [causal_lm_logits(model, input_ids, positions)[..., : config.vocab_size] for model in (full, causal)]
    assert (found - expected).abs().max().item() < 1e-5
    assert (found - same[1]).abs().max().item() > 1e-3  # the window changes what a token sees
    assert torch.equal(*same)
