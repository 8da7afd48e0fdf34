"""Hugging Face models from a local config.json: families, overrides, meta build, TP plan, bad input."""

from __future__ import annotations

import fnmatch
import json
import sys

import pytest
import torch
from nxd_models import HFOverrides, ModelConfigError, build_causal_lm, causal_lm_logits, load_hf_config
from nxd_models.hf import hf_tp_plan

TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "rope_theta": 10000.0,
}
FAMILIES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def _write(tmp_path, **content):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(content))
    return path


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_builds_trains_and_declares_a_tp_plan(tmp_path, family):
    path = _write(tmp_path, model_type=family, architectures=[FAMILIES[family]], **TINY)
    config = load_hf_config(tmp_path)  # a directory holding config.json works too
    assert load_hf_config(path).to_dict() == config.to_dict()
    model = build_causal_lm(config)
    assert type(model).__name__ == FAMILIES[family]
    assert not any(p.is_meta for p in model.parameters()) and not any(b.is_meta for b in model.buffers())
    input_ids = torch.randint(0, 128, (2, 16))
    logits = causal_lm_logits(model, input_ids, torch.arange(16).expand(2, 16))
    assert logits.shape == (2, 16, 128)
    logits.sum().backward()
    names = [name for name, _ in model.named_modules()]
    for pattern in hf_tp_plan(config):
        assert fnmatch.filter(names, pattern), pattern


def test_rotary_buffers_are_materialised_correctly(tmp_path):
    config = load_hf_config(_write(tmp_path, model_type="llama", **TINY), HFOverrides(rope_theta=500.0))
    model = build_causal_lm(config)
    expected = 1.0 / (500.0 ** (torch.arange(0, 8, 2).float() / 8))
    assert torch.allclose(model.model.rotary_emb.inv_freq, expected)


def test_documented_overrides_replace_config_json_values(tmp_path):
    path = _write(tmp_path, model_type="llama", **TINY)
    config = load_hf_config(
        path, HFOverrides(num_layers=3, hidden_size=64, max_position_embeddings=256, rope_theta=1e6)
    )
    assert (config.num_hidden_layers, config.hidden_size, config.max_position_embeddings) == (3, 64, 256)
    assert config.rope_parameters["rope_theta"] == 1e6
    assert len(build_causal_lm(config).model.layers) == 3


def test_missing_file_is_named(tmp_path):
    with pytest.raises(
        ModelConfigError,
        match=r"model.model_config: expected a config.json file or a directory with one, found no file at .*nope.json",
    ):
        load_hf_config(tmp_path / "nope.json")


def test_unsupported_architecture_is_named(tmp_path):
    path = _write(tmp_path, model_type="gpt2", architectures=["GPT2LMHeadModel"], n_embd=32)
    with pytest.raises(ModelConfigError) as caught:
        load_hf_config(path)
    assert str(caught.value) == (
        f"{path}: model_type: expected one of llama, mistral, mixtral, qwen2, qwen3, found 'gpt2' (architectures ['GPT2LMHeadModel'])"
    )


def test_unreadable_json_is_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ModelConfigError, match=r"config.json: expected a JSON object, found unreadable content"):
        load_hf_config(path)


def test_fewer_layers_keep_the_layer_type_pattern(tmp_path):
    path = _write(
        tmp_path,
        model_type="qwen2",
        **TINY,
        use_sliding_window=True,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
    )
    config = load_hf_config(path, HFOverrides(num_layers=3))
    assert config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_nxdt_recompute_names_resolve_in_transformers_models_without_changing_them(model_type):
    """`ActivationMultiplyMLP` becomes a module of each transformers MLP (act(gate) * up, as the MLP
    computed inline): same parameters, same logits and gradients, bit for bit."""
    from nxd_models import model_family
    from transformers import AutoConfig

    config = AutoConfig.for_model(
        model_type,
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    family = model_family(config)
    torch.manual_seed(0)
    model = family.build()
    batch = {"input_ids": torch.randint(0, 64, (2, 10)), "position_ids": torch.arange(10).expand(2, 10)}
    expected = family.logits(model, batch)
    expected.sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    names = set(dict(model.named_parameters()))
    units = family.recompute_units(model, ["ActivationMultiplyMLP", f"{type(model.model.norm).__name__}"])
    assert [type(u).__name__ for u in units].count("ActivationMultiplyMLP") == 2
    assert set(dict(model.named_parameters())) == names
    model.zero_grad()
    found = family.logits(model, batch)
    found.sum().backward()
    assert torch.equal(found, expected)
    assert all(torch.equal(p.grad, grads[name]) for name, p in model.named_parameters())


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "separate"])
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_qkv_linear_computes_what_transformers_model_computes(tmp_path, model_type, fuse):
    """NxDT's qkv_linear (one GQA QKV module, one matmul with fuse_qkv) in a transformers model: the
    module holds the q/k/v values transformers initialised, its keys map to q_proj/k_proj/v_proj, and
    transformers' own model loaded with them computes the same logits (sliding window, biases and
    query/key norms included), in training mode too (gradients)."""
    from nxd_models import model_family
    from transformers import AutoModelForCausalLM

    content = {
        **TINY,
        "model_type": model_type,
        "attention_bias": True,
        "sliding_window": 5,
        "head_dim": 8,
        "tie_word_embeddings": False,
    }
    config = load_hf_config(_write(tmp_path, **content), HFOverrides(qkv_linear=True, fuse_qkv=fuse))
    plain = load_hf_config(tmp_path / "config.json")
    family = model_family(config)
    torch.manual_seed(0)
    ours = family.build()
    torch.manual_seed(0)
    unfused = model_family(plain).build()
    attention = ours.model.layers[0].self_attn
    assert "q_proj.weight" not in dict(attention.named_parameters()) and attention.qkv_proj.fuse is fuse
    keys = family.hf_mapping().keys
    assert keys["model.layers.1.self_attn.qkv_proj.weight_k"] == "model.layers.1.self_attn.k_proj.weight"
    state = {keys[name]: value for name, value in ours.state_dict().items()}
    assert all(torch.equal(state[name], value) for name, value in unfused.state_dict().items())  # same init
    assert "nxd_qkv_linear" not in family.hf_mapping().config
    theirs = AutoModelForCausalLM.from_config(plain, attn_implementation="eager")
    theirs.load_state_dict(state)
    batch = {"input_ids": torch.randint(0, 128, (2, 12)), "position_ids": torch.arange(12).expand(2, 12)}
    found = family.logits(ours, batch)
    expected = theirs(input_ids=batch["input_ids"]).logits
    assert (found - expected).abs().max().item() < 1e-5
    found.square().mean().backward()
    expected.square().mean().backward()
    grads = {keys[name]: p.grad for name, p in ours.named_parameters()}
    assert all((grads[name] - p.grad).abs().max() < 1e-5 for name, p in theirs.named_parameters())
    assert any(name.endswith("qkv_proj") and style == "qkv" for name, style in family.tp_plan().items())


@pytest.mark.parametrize("documents", [False, True], ids=["causal", "documents"])
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_pipeline_stages_of_a_transformers_model_chain_to_its_own_logits(model_type, documents):
    """Cut into three stages (layers 0-1 with the embedding, 2, 3 with norm and output layer), a
    transformers model passes ids -> residual stream -> logits equal to its own forward, with sliding
    windows shorter than the row (mistral, qwen2 layer types) and packed documents."""
    import copy

    from nxd_models import AttentionKernel, model_family
    from transformers import AutoConfig

    config = AutoConfig.for_model(
        model_type,
        **{**TINY, "num_hidden_layers": 4},
        sliding_window=4,
        head_dim=8,
        use_sliding_window=True,
        max_window_layers=2,
        tie_word_embeddings=False,
    )
    for kernel in (AttentionKernel.FLASH, AttentionKernel.UNFUSED):
        family = model_family(config, kernel)
        torch.manual_seed(0)
        whole = family.build()
        batch = {"input_ids": torch.randint(0, 128, (2, 12)), "position_ids": torch.arange(12).expand(2, 12)}
        if documents:
            batch["document_ids"] = torch.tensor([[0] * 5 + [1] * 7, [0] * 12])
            batch["position_ids"] = torch.tensor([[*range(5), *range(7)], list(range(12))])
        expected = family.logits(whole, batch)
        hidden = batch["input_ids"]
        for layers, first, last in (
            (range(0, 2), True, False),
            (range(2, 3), False, False),
            (range(3, 4), False, True),
        ):
            stage = family.keep_pipeline_stage(copy.deepcopy(whole), layers, first=first, last=last)
            assert len(family.decoder_layers(stage)) == len(layers)
            hidden = stage(hidden, position_ids=batch["position_ids"], document_ids=batch.get("document_ids"))
        assert hidden.shape == expected.shape and (hidden - expected).abs().max().item() < 1e-6, kernel


def test_sliding_window_of_a_transformers_model_holds_inside_packed_documents():
    """A packed row of two documents gives each document the logits transformers' Mistral computes on
    that document alone (the window is kept inside documents, for the SDPA and the eager kernel)."""
    from nxd_models import AttentionKernel, model_family
    from transformers import AutoConfig

    config = AutoConfig.for_model("mistral", **TINY, sliding_window=3, tie_word_embeddings=False)
    for kernel in (AttentionKernel.FLASH, AttentionKernel.UNFUSED):
        family = model_family(config, kernel)
        torch.manual_seed(0)
        model = family.build()
        ids = torch.randint(0, 128, (1, 13))
        batch = {
            "input_ids": ids,
            "document_ids": torch.tensor([[0] * 6 + [1] * 7]),
            "position_ids": torch.tensor([[*range(6), *range(7)]]),
        }
        found = family.logits(model, batch)
        alone = [model(input_ids=ids[:, :6]).logits, model(input_ids=ids[:, 6:]).logits]
        assert (found - torch.cat(alone, dim=1)).abs().max().item() < 1e-5, kernel


def test_without_transformers_a_hugging_face_model_names_the_extra_that_installs_it(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 64}))
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    with pytest.raises(ModelConfigError, match=r"transformers, which is not installed; install nxd-models\[hf\]"):
        load_hf_config(tmp_path)
