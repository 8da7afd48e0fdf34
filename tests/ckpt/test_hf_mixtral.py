"""Mixtral through the Hugging Face mapping: a Megatron-style MoE exports to transformers'
MixtralForCausalLM with equal logits, and the HF family builds a Mixtral from its config.json whose
logits equal transformers' and whose weights import and export back bit for bit (an expert-parallel
rank's reads: tests/parallel/test_streamed_loading.py)."""

from __future__ import annotations

import json

import pytest
import torch
from nxd_ckpt import CheckpointError, HFExport, export_hf, load_hf_weights
from nxd_models import (
    HFOverrides,
    ModelConfigError,
    MoESpec,
    build_causal_lm,
    causal_lm_logits,
    load_hf_config,
    model_family,
)
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM

from .test_hf import checkpoint_of, llama_shaped, random_weights, tokens

MIXTRAL = MoESpec(num_experts=4, top_k=2, normalize_top_k_affinities=True)


def mixtral_config(**changes) -> MixtralConfig:
    return MixtralConfig(
        **{
            "vocab_size": 120,
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "max_position_embeddings": 64,
            "rope_theta": 10000.0,
            **changes,
        }
    )


def test_megatron_moe_exports_as_a_mixtral_with_equal_logits(tmp_path):
    spec = llama_shaped(moe=MIXTRAL)
    ours = build_causal_lm(spec).eval()
    random_weights(ours)
    out = export_hf(checkpoint_of(ours, spec, tmp_path / "ckpts"), tmp_path / "hf")
    assert "model.layers.1.block_sparse_moe.experts.3.w2.weight" in load_file(out / "model.safetensors")
    theirs = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(theirs) is MixtralForCausalLM and theirs.config.num_local_experts == 4
    ids, positions = tokens(spec.vocab_size)
    with torch.no_grad():
        found = causal_lm_logits(ours, ids, positions)[..., : spec.vocab_size]
        assert (found - theirs(input_ids=ids).logits).abs().max().item() < 1e-5


def test_a_moe_without_a_mixtral_counterpart_says_why():
    spec = llama_shaped(moe=MoESpec(num_experts=4, top_k=2, router_activation="sigmoid"))
    with pytest.raises(
        ModelConfigError,
        match="moe.router_activation is 'sigmoid' .Mixtral needs 'softmax'.; moe.normalize_top_k_affinities is False",
    ):
        model_family(spec).hf_mapping()


def _mixtral_dir(tmp_path):
    source = MixtralForCausalLM(mixtral_config()).eval()
    random_weights(source)
    source.save_pretrained(tmp_path / "source")
    return source, tmp_path / "source"


def test_hf_family_builds_a_mixtral_whose_logits_equal_transformers(tmp_path):
    source, directory = _mixtral_dir(tmp_path)
    config = load_hf_config(directory)
    family = model_family(config)
    assert family.moe == MoESpec(num_experts=4, top_k=2, normalize_top_k_affinities=True)
    ours = build_causal_lm(config).eval()
    export = HFExport.of(family.hf_mapping())
    load_hf_weights(directory, export, family.parameter_shapes(), ours.state_dict())
    ids, positions = tokens(120)
    with torch.no_grad():
        assert (causal_lm_logits(ours, ids, positions) - source(input_ids=ids).logits).abs().max().item() < 1e-5
    out = export_hf(checkpoint_of(ours, config, tmp_path / "ckpts"), tmp_path / "hf")
    before, after = load_file(directory / "model.safetensors"), load_file(out / "model.safetensors")
    assert before.keys() == after.keys() and all(torch.equal(before[key], after[key]) for key in before)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["MixtralForCausalLM"]


def test_moe_keys_set_a_mixtral_and_are_refused_for_a_dense_config(tmp_path):
    _, directory = _mixtral_dir(tmp_path)
    moe = MoESpec(num_experts=4, top_k=1, capacity_factor=1.5, router_aux_loss=True, router_aux_loss_coef=0.02)
    config = load_hf_config(directory, HFOverrides(moe=moe))
    assert (config.num_experts_per_tok, config.router_aux_loss_coef, model_family(config).moe) == (1, 0.02, moe)
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(
        json.dumps({"model_type": "llama", "vocab_size": 120, "hidden_size": 32, "num_attention_heads": 4})
    )
    with pytest.raises(
        ModelConfigError,
        match="model.moe: a Hugging Face model takes a moe block only when .* is a "
        "Mixtral .model_type mixtral., found 'llama'",
    ):
        load_hf_config(tmp_path / "llama", HFOverrides(moe=moe))


def test_import_names_a_missing_expert(tmp_path):
    _, directory = _mixtral_dir(tmp_path)
    config = load_hf_config(directory, HFOverrides(moe=MoESpec(num_experts=4, top_k=2)))
    family = model_family(
        config.__class__(
            **{**config.to_dict(), "num_local_experts": 8, "nxd_moe": {**config.nxd_moe, "num_experts": 8}}
        )
    )
    with pytest.raises(CheckpointError, match="missing model.layers.0.block_sparse_moe.experts.4.w1.weight"):
        load_hf_weights(directory, HFExport.of(family.hf_mapping()), family.parameter_shapes(), {})
