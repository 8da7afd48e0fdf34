"""Hugging Face export and import: transformers' own model, loaded from the export, is the reference."""

from __future__ import annotations

import pytest
import torch
from nxd_ckpt import MODEL_KEY, Checkpointer, CheckpointError, HFExport, SavePolicy, export_hf, load_hf_weights
from nxd_models import GPTConfig, ModelConfigError, build_causal_lm, causal_lm_logits, model_family
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

SEQ = 16


def llama_shaped(**changes) -> GPTConfig:
    base = dict(
        vocab_size=250,
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_kv_heads=2,
        seq_length=SEQ,
        ffn_hidden_size=48,
        normalization="rmsnorm",
        activation="swiglu",
        position_embedding_type="rope",
        rope_theta=10000.0,
        has_bias=False,
        share_embeddings_and_output_weights=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        make_vocab_size_divisible_by=64,
    )
    return GPTConfig(**{**base, **changes})


def hf_export(spec) -> HFExport:
    return HFExport.of(model_family(spec).hf_mapping())


def checkpoint_of(model: torch.nn.Module, spec, root) -> object:
    """A checkpoint of `model` whose marker records its Hugging Face mapping (or why it has none), as
    nxd-train writes it."""
    try:
        extra = {"hf_export": hf_export(spec).to_json()}
    except ModelConfigError as error:
        extra = {"hf_export_problem": str(error)}
    return Checkpointer(root, SavePolicy(filename="ckpt")).save(
        {MODEL_KEY: model.state_dict()}, step=1, consumed_samples=1, metrics={}, extra=extra
    )


def tokens(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(0))
    return ids, torch.arange(SEQ).expand(2, SEQ)


def random_weights(model: torch.nn.Module) -> None:
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.2)


@pytest.mark.parametrize(
    "changes",
    [{}, {"qkv_linear": True, "share_embeddings_and_output_weights": True}, {"has_bias": True}],
    ids=["plain", "fused_qkv_tied", "bias"],
)
def test_megatron_export_loads_in_transformers(tmp_path, changes):
    spec = llama_shaped(**changes)
    ours = build_causal_lm(spec).eval()
    random_weights(ours)
    out = export_hf(checkpoint_of(ours, spec, tmp_path / "ckpts"), tmp_path / "hf")
    theirs = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(theirs) is LlamaForCausalLM and theirs.config.vocab_size == spec.vocab_size
    ids, positions = tokens(spec.vocab_size)
    with torch.no_grad():
        expected = theirs(input_ids=ids).logits
        found = causal_lm_logits(ours, ids, positions)[..., : spec.vocab_size]
    assert (found - expected).abs().max().item() < 1e-5


def test_hf_family_export_loads_in_transformers(tmp_path):
    spec = LlamaConfig(
        vocab_size=120,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    ours = build_causal_lm(spec).eval()
    random_weights(ours)
    out = export_hf(checkpoint_of(ours, spec, tmp_path / "ckpts"), tmp_path / "hf", dtype=torch.bfloat16)
    theirs = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert load_file(out / "model.safetensors")["lm_head.weight"].dtype == torch.bfloat16
    for name, tensor in theirs.state_dict().items():
        assert torch.equal(tensor, ours.state_dict()[name].to(torch.bfloat16).float()), name


def test_import_then_export_round_trips_bit_exactly(tmp_path):
    spec = llama_shaped()
    source = LlamaForCausalLM(LlamaConfig(**hf_export(spec).config))
    random_weights(source)
    source.save_pretrained(tmp_path / "source")
    ours = build_causal_lm(spec)
    shapes = {key: value.shape for key, value in ours.state_dict().items()}
    load_hf_weights(tmp_path / "source", hf_export(spec), shapes, ours.state_dict())
    out = export_hf(checkpoint_of(ours, spec, tmp_path / "ckpts"), tmp_path / "hf")
    before, after = load_file(tmp_path / "source" / "model.safetensors"), load_file(out / "model.safetensors")
    assert before.keys() == after.keys()
    assert all(torch.equal(before[key], after[key]) for key in before)


def test_import_names_what_does_not_fit(tmp_path):
    spec = llama_shaped()
    other = LlamaForCausalLM(LlamaConfig(**{**hf_export(spec).config, "intermediate_size": 64}))
    other.save_pretrained(tmp_path / "other")
    shapes = {key: value.shape for key, value in build_causal_lm(spec).state_dict().items()}
    with pytest.raises(
        CheckpointError,
        match=r"other/model.safetensors: model.layers.0.mlp.\w+_proj.weight is \[\d+, \d+\]; this model.s",
    ):
        load_hf_weights(tmp_path / "other", hf_export(spec), shapes, build_causal_lm(spec).state_dict())


def test_export_of_a_model_without_hf_counterpart_says_why(tmp_path):
    spec = llama_shaped(normalization="scalenorm")
    path = checkpoint_of(build_causal_lm(spec), spec, tmp_path / "ckpts")
    with pytest.raises(CheckpointError, match="normalization is 'scalenorm' \\(Llama needs 'rmsnorm'\\)"):
        export_hf(path, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_hf_family_with_qkv_linear_exports_transformers_layout_and_imports_it(tmp_path):
    """A transformers Llama trained with NxDT's qkv_linear exports q_proj/k_proj/v_proj (config.json
    without nxd's setting), loads in transformers with equal logits, and imports back bit-exactly."""
    from nxd_models.hf_qkv import set_qkv_linear

    spec = LlamaConfig(
        vocab_size=120,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    set_qkv_linear(spec, True, True)
    ours = build_causal_lm(spec).eval()
    random_weights(ours)
    out = export_hf(checkpoint_of(ours, spec, tmp_path / "ckpts"), tmp_path / "hf")
    assert "nxd_qkv_linear" not in (out / "config.json").read_text()
    theirs = AutoModelForCausalLM.from_pretrained(out).eval()
    ids, positions = tokens(spec.vocab_size)
    with torch.no_grad():
        assert (causal_lm_logits(ours, ids, positions) - theirs(input_ids=ids).logits).abs().max().item() < 1e-5
    shapes = {key: value.shape for key, value in ours.state_dict().items()}
    loaded = build_causal_lm(spec)
    load_hf_weights(out, hf_export(spec), shapes, loaded.state_dict())
    assert all(torch.equal(loaded.state_dict()[key], value) for key, value in ours.state_dict().items())
    assert "model.layers.0.self_attn.qkv_proj.weight_v" in loaded.state_dict()


def test_import_names_a_damaged_file_and_a_missing_tensor_before_reading_any_value(tmp_path):
    spec = llama_shaped()
    source = LlamaForCausalLM(LlamaConfig(**hf_export(spec).config))
    source.save_pretrained(tmp_path / "source")
    shapes = {key: value.shape for key, value in build_causal_lm(spec).state_dict().items()}
    file = tmp_path / "source" / "model.safetensors"
    whole = load_file(file)
    target = build_causal_lm(spec)
    before = {key: value.clone() for key, value in target.state_dict().items()}
    file.write_bytes(file.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"source/model.safetensors: not a readable safetensors file"):
        load_hf_weights(tmp_path / "source", hf_export(spec), shapes, target.state_dict())
    del whole["model.layers.1.mlp.up_proj.weight"]
    save_file(whole, file)
    with pytest.raises(
        CheckpointError,
        match=r"source: the weights do not match this model: missing "
        r"model.layers.1.mlp.up_proj.weight",
    ):
        load_hf_weights(tmp_path / "source", hf_export(spec), shapes, target.state_dict())
    assert all(torch.equal(before[key], value) for key, value in target.state_dict().items())
