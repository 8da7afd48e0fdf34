"""GPT-NeoX shapes in Hugging Face's format: transformers' own GPTNeoXForCausalLM is the reference."""

from __future__ import annotations

import pytest
import torch
from nxd_ckpt import CheckpointError, HFExport, export_hf, load_hf_weights
from nxd_models import GPTConfig, build_causal_lm, causal_lm_logits, model_family
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GPTNeoXConfig, GPTNeoXForCausalLM

from .test_hf import SEQ, checkpoint_of, random_weights, tokens

VOCAB = 250


def pythia_shaped(**changes) -> GPTConfig:
    """Pythia's shape: parallel residual from two layernorms, rotary on a quarter of each head, gelu's tanh form
    (what NeoX's bias_gelu_fusion computes), biases, untied output layer."""
    base = dict(
        vocab_size=VOCAB,
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        seq_length=SEQ,
        ffn_hidden_size=64,
        normalization="layernorm",
        position_embedding_type="rope",
        rotary_percentage=0.25,
        transformer_block_type="gpt_neox",
        activation="approx-gelu",
        share_embeddings_and_output_weights=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        make_vocab_size_divisible_by=64,
    )
    return GPTConfig(**{**base, **changes})


def _whole_rows(tensor: torch.Tensor, name: str) -> torch.Tensor:
    return tensor[:VOCAB] if "embed" in name or "lm_head" in name else tensor


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"transformer_block_type": "pre_ln", "activation": "gelu", "share_embeddings_and_output_weights": True},
        {"attention_bias": False, "qkv_linear": True},
    ],
    ids=["pythia", "sequential-tied-gelu", "no-attention-bias-qkv-module"],
)
def test_gpt_neox_shapes_export_to_transformers_and_import_back(tmp_path, changes):
    spec = pythia_shaped(**changes)
    ours = build_causal_lm(spec).eval()
    random_weights(ours)
    out = export_hf(checkpoint_of(ours, spec, tmp_path / "ckpts"), tmp_path / "hf")
    theirs = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(theirs) is GPTNeoXForCausalLM
    assert theirs.config.use_parallel_residual == (spec.transformer_block_type == "gpt_neox")
    assert theirs.config.hidden_act == ("gelu" if spec.activation == "gelu" else "gelu_pytorch_tanh")
    ids, positions = tokens(VOCAB)
    with torch.no_grad():
        expected = theirs(input_ids=ids).logits
        found = causal_lm_logits(ours, ids, positions)[..., :VOCAB]
    assert (found - expected).abs().max().item() < 1e-5
    fresh = build_causal_lm(spec)
    family = model_family(spec)
    load_hf_weights(out, HFExport.of(family.hf_mapping()), family.parameter_shapes(), dict(fresh.state_dict()))
    for (name, value), original in zip(fresh.state_dict().items(), ours.state_dict().values(), strict=True):
        assert torch.equal(_whole_rows(value, name), _whole_rows(original, name)), name


def test_a_transformers_gpt_neox_directory_is_a_starting_point(tmp_path):
    """Weights saved by transformers' GPTNeoXForCausalLM (as Pythia's are, with the buffers older versions kept)
    load into the same shape, each query_key_value read head by head into q, k and v."""
    config = GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=SEQ,
        rotary_pct=0.25,
        use_parallel_residual=True,
        hidden_act="gelu",
        tie_word_embeddings=False,
    )
    torch.manual_seed(3)
    pythia = GPTNeoXForCausalLM(config).eval()
    random_weights(pythia)
    pythia.save_pretrained(tmp_path / "pythia")
    weights = tmp_path / "pythia" / "model.safetensors"  # as older transformers saved Pythia: with buffers
    tensors = load_file(weights)
    for layer in range(2):
        tensors[f"gpt_neox.layers.{layer}.attention.bias"] = torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool).tril()
        tensors[f"gpt_neox.layers.{layer}.attention.masked_bias"] = torch.tensor(-1e9)
        tensors[f"gpt_neox.layers.{layer}.attention.rotary_emb.inv_freq"] = torch.ones(1)
    save_file(tensors, weights, metadata={"format": "pt"})
    spec = pythia_shaped(activation="gelu")
    ours = build_causal_lm(spec).eval()
    family = model_family(spec)
    load_hf_weights(
        tmp_path / "pythia", HFExport.of(family.hf_mapping()), family.parameter_shapes(), dict(ours.state_dict())
    )
    ids, positions = tokens(VOCAB)
    with torch.no_grad():
        assert (causal_lm_logits(ours, ids, positions)[..., :VOCAB] - pythia(input_ids=ids).logits).abs().max() < 1e-5


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"position_embedding_type": "alibi"}, "position_embedding_type is 'alibi' (GPT-NeoX uses rope)"),
        ({"position_embedding_type": "sinusoidal"}, "position_embedding_type is 'sinusoidal' (GPT-NeoX uses rope)"),
        ({"normalization": "scalenorm"}, "normalization is 'scalenorm' (GPT-NeoX uses layernorm)"),
        ({"activation": "swiglu"}, "activation is 'swiglu' (GPT-NeoX's hidden_act takes"),
        ({"mlp_bias": False}, "mlp_bias is False (GPT-NeoX's MLP always has biases)"),
        (
            {"transformer_block_type": "gpt_j"},
            "transformer_block_type is 'gpt_j' (GPT-NeoX runs gpt_neox or pre_ln blocks)",
        ),
        ({"rotary_percentage": 0.375}, "rotary_percentage 0.375 rotates an odd 3 of 8 dims"),
    ],
)
def test_shapes_transformers_cannot_hold_are_refused_by_key(tmp_path, changes, message):
    spec = pythia_shaped(**changes)
    path = checkpoint_of(build_causal_lm(spec), spec, tmp_path / "ckpts")
    with pytest.raises(CheckpointError) as caught:
        export_hf(path, tmp_path / "hf")
    assert message in str(caught.value)
    assert not (tmp_path / "hf").exists()
