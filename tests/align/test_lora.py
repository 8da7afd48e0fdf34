"""LoRA adapters on both model families: the update by hand, the start equal to the base model, the
trainable count by formula, the merge, the fused QKV module, and one clear error per bad target."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from nxd_align import LoraConfigError, LoraFamily, LoraSpec, adapters_disabled
from nxd_models import model_family

from tests.parallel.parity import model_spec

EVERY = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "position_ids": torch.arange(16).expand(2, 16)}


def _built(family, seed: int = 3) -> torch.nn.Module:
    torch.manual_seed(seed)
    return family.build(torch.device("cpu"), use_cpu_initialization=True)


@torch.no_grad()
def test_an_adapted_layer_computes_w_x_plus_alpha_over_r_b_a_x_worked_by_hand():
    lora = LoraFamily(model_family(model_spec("hf")), LoraSpec(rank=2, alpha=6, targets=("o_proj",)))
    layer = _built(lora).model.layers[0].self_attn.o_proj
    weight, a, b = layer.base_layer.weight, layer.lora_A["default"].weight, layer.lora_B["default"].weight
    for tensor in (weight, a, b):
        tensor.zero_()
    weight[:2, :2] = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    a[:, :2] = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    b[:2, :] = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    x = torch.zeros(32)
    x[:2] = torch.tensor([1.0, 2.0])
    # W x = [1 + 4, 3 + 8] = [5, 11]; A x = [1, 3]; B A x = [1, 6]; alpha / r = 3: [5 + 3, 11 + 18]
    expected = torch.zeros(32)
    expected[:2] = torch.tensor([8.0, 29.0])
    assert torch.equal(layer(x), expected)


@pytest.mark.parametrize("family, qkv", [("megatron", None), ("megatron", "fused"), ("hf", None)])
def test_adapters_start_as_the_base_model_and_only_they_train(family, qkv):
    base = model_family(model_spec(family, qkv=qkv))
    lora = LoraFamily(base, LoraSpec(rank=4, alpha=8, targets=EVERY))
    plain, adapted = _built(base), _built(lora)
    assert torch.equal(base.logits(plain, _batch()), lora.logits(adapted, _batch()))  # B starts at zero
    trained = {name: p for name, p in adapted.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in name or ".lora_B." in name for name in trained)
    # hidden 32, 4 heads of 8, 2 KV heads, ffn 64, 2 layers, r 4: r (in + out) per adapted weight
    per_layer = 4 * ((32 + 32) + 2 * (32 + 16) + (32 + 32) + 2 * (32 + 64) + (64 + 32))
    assert lora.trainable_count() == sum(p.numel() for p in trained.values()) == 2 * per_layer == 4096


def test_nxdt_and_transformers_names_select_the_same_layers():
    base = model_family(model_spec("megatron"))
    nxdt = LoraFamily(base, LoraSpec(targets=("qkv_proj", "gate_up_proj")))
    transformers_names = LoraFamily(base, LoraSpec(targets=("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")))
    assert nxdt.modules == transformers_names.modules
    assert [name.rpartition(".")[2] for name in nxdt.modules[:5]] == [
        "q_proj",
        "k_proj",
        "v_proj",
        "gate_proj",
        "up_proj",
    ]


def test_fused_qkv_gets_an_adapter_per_projection_in_peft_s_layout():
    lora = LoraFamily(model_family(model_spec("megatron", qkv="fused")), LoraSpec(rank=4, targets=("q_proj", "v_proj")))
    assert lora.fused == {f"model.layers.{i}.self_attn.qkv_proj": ("q", "v") for i in range(2)}
    keys = lora.adapter_export()["keys"]
    assert keys["model.layers.1.self_attn.qkv_proj.lora_B.v.weight"] == (
        "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
    )
    assert lora.adapter_export()["config"]["target_modules"] == ["q_proj", "v_proj"]


@torch.no_grad()
def test_merged_weights_are_w_plus_scaled_b_a_in_fp32_and_leave_the_live_weights_alone():
    lora = LoraFamily(model_family(model_spec("hf")), LoraSpec(rank=4, alpha=8, targets=("q_proj",)))
    model = _built(lora)
    layer = model.model.layers[0].self_attn.q_proj
    layer.lora_B["default"].weight.normal_()
    model.bfloat16()
    live = layer.base_layer.weight.clone()
    merged = lora.checkpoint_weights(model, base="merged")
    a, b = layer.lora_A["default"].weight.float(), layer.lora_B["default"].weight.float()
    expected = layer.base_layer.weight.float() + 2.0 * b @ a
    assert merged["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float32
    torch.testing.assert_close(merged["model.layers.0.self_attn.q_proj.weight"], expected, rtol=0, atol=1e-6)
    assert torch.equal(layer.base_layer.weight, live)
    assert "model.layers.0.self_attn.q_proj.lora_A.default.weight" in merged
    only_adapters = lora.checkpoint_weights(model)
    assert set(only_adapters) == {name for name, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("qkv", [False, True])
def test_lora_bias_trains_every_bias_or_those_of_the_adapted_layers(qkv):
    spec = dataclasses.replace(model_spec("gpt"), qkv_linear=qkv)  # biases everywhere
    layer = "model.layers.0"
    trained = {}
    for bias in ("none", "all", "lora_only"):
        model = _built(LoraFamily(model_family(spec), LoraSpec(rank=2, bias=bias, targets=("q_proj", "o_proj"))))
        trained[bias] = {name for name, p in model.named_parameters() if p.requires_grad and ".lora_" not in name}
    q_bias = f"{layer}.self_attn.qkv_proj.base_layer.bias_q" if qkv else f"{layer}.self_attn.q_proj.base_layer.bias"
    assert trained["none"] == set()
    assert {q_bias, f"{layer}.self_attn.o_proj.base_layer.bias", f"{layer}.mlp.up_proj.bias"} <= trained["all"]
    assert not any(name.endswith("weight") for name in trained["all"])
    assert trained["lora_only"] == {
        name.replace("layers.0", f"layers.{i}")
        for i in range(2)
        for name in (q_bias, f"{layer}.self_attn.o_proj.base_layer.bias")
    }


@pytest.mark.parametrize(
    "targets, expected",
    [
        (
            ("qkv", "o_proj"),
            "'qkv' names no linear layer of this model; expected some of down_proj, gate_proj, "
            "gate_up_proj, k_proj, o_proj, q_proj, qkv_proj, up_proj, v_proj",
        ),
        (("input_layernorm",), "'input_layernorm' is a RMSNorm, not a linear layer"),
        (("self_attn",), "'self_attn' is a SelfAttention, not a linear layer"),
        ((), "expected at least one module, found an empty list"),
    ],
)
def test_targets_that_name_no_linear_layer_are_refused(targets, expected):
    with pytest.raises(LoraConfigError) as error:
        LoraFamily(model_family(model_spec("megatron")), LoraSpec(targets=targets))
    assert f"model_alignment_strategy.peft.target_modules: {expected}" in str(error.value)


def test_the_base_is_held_in_the_policy_s_dtype_and_only_adapters_get_master_weights():
    from nxd_precision import PrecisionOptimizer, prepare_parameters, resolve_policy

    policy = resolve_policy("mixed_precision")  # bf16 parameters, fp32 master weights and optimizer state
    lora = LoraFamily(model_family(model_spec("hf")), LoraSpec(rank=4, targets=EVERY))
    model = _built(lora)
    prepare_parameters(model, policy)
    optimizer = PrecisionOptimizer(model.parameters(), policy, lambda tensors: torch.optim.AdamW(tensors))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert sum(copy.numel() for copy in optimizer.copies) == lora.trainable_count()
    assert {copy.dtype for copy in optimizer.copies} == {torch.float32}


@pytest.mark.parametrize("qkv", [None, "fused"])
@torch.no_grad()
def test_with_adapters_disabled_the_model_computes_its_base(qkv):
    base = model_family(model_spec("megatron", qkv=qkv))
    lora = LoraFamily(base, LoraSpec(rank=4, alpha=8, targets=EVERY))
    plain, adapted = _built(base), _built(lora)
    for name, parameter in adapted.named_parameters():
        if ".lora_B." in name:
            parameter.normal_()
    trained = {name for name, p in adapted.named_parameters() if p.requires_grad}
    assert not torch.equal(lora.logits(adapted, _batch()), base.logits(plain, _batch()))
    with adapters_disabled([adapted]):
        assert torch.equal(lora.logits(adapted, _batch()), base.logits(plain, _batch()))
    assert {name for name, p in adapted.named_parameters() if p.requires_grad} == trained


def test_without_peft_lora_names_the_extra_that_installs_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` raises ImportError
    with pytest.raises(LoraConfigError, match=r"peft is not installed; install nxd-align\[lora\]"):
        LoraFamily(model_family(model_spec("megatron")), LoraSpec(rank=4))
