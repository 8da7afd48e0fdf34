"""precision.fp8: torchao's float8 training of the decoder layers' linear layers. The configs equal torchao's own
recipes; emulated on the CPU, the float8 model stays within the signal-to-quantisation-noise ratio torchao's tests
hold its float8 linear layers to, and trains as close to the fp32 run as that allows."""

from __future__ import annotations

import pytest
import torch
from nxd_models import GPTConfig, build_causal_lm
from nxd_models.build import build_on_meta
from nxd_precision import Float8Spec, float8_coverage, float8_support_problem, prepare_parameters, resolve_policy
from nxd_precision.float8 import float8_config, use_float8
from torchao.float8.config import Float8LinearConfig, ScalingGranularity, ScalingType
from torchao.float8.float8_linear import Float8Linear
from torchao.float8.float8_utils import compute_error

CONFIG = GPTConfig(
    vocab_size=128,
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    num_kv_heads=2,
    seq_length=32,
    ffn_hidden_size=176,
    normalization="rmsnorm",
    activation="swiglu",
    position_embedding_type="rope",
    has_bias=False,
    hidden_dropout=0.0,
    attention_dropout=0.0,
    make_vocab_size_divisible_by=8,
    share_embeddings_and_output_weights=False,
)
OUTPUT_SQNR_DB, GRADIENT_SQNR_DB = 18.0, 17.0
"""torchao's float8 tests accept a float8 linear layer's output at 18 dB of signal-to-quantisation noise and its
weight gradient at 17 dB (test/float8/test_base.py); held here for a whole model's logits and every gradient."""


def test_configs_are_torchaos_recipes():
    assert float8_config(Float8Spec()) == Float8LinearConfig.from_recipe_name("tensorwise")
    assert float8_config(Float8Spec(recipe="rowwise")) == Float8LinearConfig.from_recipe_name("rowwise")
    e4m3 = float8_config(Float8Spec(format="e4m3"))
    assert e4m3.cast_config_grad_output.target_dtype == torch.float8_e4m3fn
    high = float8_config(Float8Spec(weight_gradient=False))
    assert high.cast_config_input_for_grad_weight.scaling_type is ScalingType.DISABLED
    assert high.cast_config_grad_output_for_grad_weight.scaling_type is ScalingType.DISABLED
    assert high.cast_config_input.scaling_granularity is ScalingGranularity.TENSORWISE
    assert float8_config(Float8Spec(emulate=True)).emulate


def test_the_decoder_layers_linear_layers_become_float8():
    """Attention and MLP projections swap (names and values unchanged); the output layer, an MLP whose width is not a
    multiple of 16 and fused QKV modules keep their precision, and `float8_coverage` counts what stays."""
    model = build_causal_lm(CONFIG, seed=1)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    swapped = use_float8(model, Float8Spec(emulate=True))
    assert swapped == [
        f"model.layers.{i}.{part}"
        for i in range(2)
        for part in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    ]
    assert not isinstance(model.lm_head, Float8Linear)
    assert all(torch.equal(before[name], p) for name, p in model.named_parameters())
    odd = build_causal_lm(GPTConfig(**{**CONFIG.__dict__, "ffn_hidden_size": 40}), seed=1)
    assert "model.layers.0.mlp.up_proj" not in use_float8(odd, Float8Spec(emulate=True))
    fused = build_on_meta(GPTConfig(**{**CONFIG.__dict__, "qkv_linear": True}))
    swapped, kept = float8_coverage(fused, Float8Spec(emulate=True))
    assert len(swapped) == 8 and kept == {"QKVLinear": 2}


def test_kept_patterns_mamba_step_sizes_and_gathered_weights_in_the_policys_dtype():
    """`kept` leaves the named layers (nxd-train: replicated key/value projections); a Mamba mixer's dt_proj, whose
    weight the mixer reads itself, stays; a weight FSDP2 is to gather as float8 holds the policy's dtype."""
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    kept = Float8Spec(emulate=True, kept=("model.layers.*.self_attn.k_proj", "model.layers.*.self_attn.v_proj"))
    swapped = use_float8(build_on_meta(CONFIG), kept)
    assert len(swapped) == 10 and not any(name.endswith(("k_proj", "v_proj")) for name in swapped)
    mamba = build_on_meta(GPTConfig(**{**CONFIG.__dict__, "hidden_size": 256, "attention_layers": ("mamba",) * 2}))
    swapped = use_float8(mamba, Float8Spec(emulate=True))
    assert "model.layers.0.mixer.in_proj" in swapped and not any("dt_proj" in name for name in swapped)
    model = build_on_meta(CONFIG)
    prepare_parameters(model, resolve_policy("mixed_precision", float8=Float8Spec(emulate=True, all_gather=True)))
    weight = model.get_parameter("model.layers.0.mlp.up_proj.weight")
    assert isinstance(weight.data, WeightWithDynamicFloat8CastTensor)
    assert weight.data._tensor.dtype == torch.bfloat16


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 128, (4, 33), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}


@pytest.mark.parametrize(
    "spec",
    [
        Float8Spec(emulate=True),
        Float8Spec(recipe="rowwise", emulate=True),
        Float8Spec(format="e4m3", weight_gradient=False, emulate=True),
    ],
    ids=["tensorwise", "rowwise", "e4m3-wgrad-high"],
)
def test_emulated_float8_stays_within_torchaos_tolerance(spec):
    """The logits and every gradient of the float8 model against the same model's in fp32 within torchao's SQNR; and
    eight steps of AdamW keep the float8 losses within 2% of the fp32 ones."""
    reference = build_causal_lm(CONFIG, seed=3)
    model = build_causal_lm(CONFIG, seed=3)
    prepare_parameters(model, resolve_policy("fp32", float8=spec))
    assert isinstance(model.model.layers[0].mlp.down_proj, Float8Linear)
    batch = _batch()
    logits = model(batch["input_ids"])
    expected = reference(batch["input_ids"])
    assert compute_error(expected, logits) >= OUTPUT_SQNR_DB
    assert not torch.equal(expected, logits)  # float8 changed the numbers
    for net in (model, reference):
        net(batch["input_ids"], labels=batch["labels"]).mean().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert compute_error(q.grad, p.grad) >= GRADIENT_SQNR_DB, name
    losses = {}
    for label, net in (("fp8", model), ("fp32", reference)):
        net.zero_grad()
        optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)
        losses[label] = []
        for _ in range(8):
            loss = net(batch["input_ids"], labels=batch["labels"]).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses[label].append(loss.item())
    assert losses["fp32"][-1] < losses["fp32"][0] - 1.0  # it learns
    assert losses["fp8"] == pytest.approx(losses["fp32"], rel=0.02)


def test_devices_without_float8_matmuls_are_refused_unless_emulated():
    problem = float8_support_problem(Float8Spec(), torch.device("cpu"))
    assert (
        problem.startswith(
            "precision.fp8: float8 matmuls (torch._scaled_mm) need a GPU of CUDA compute capability 8.9 or newer"
        )
        and "found the cpu device" in problem
    )
    assert float8_support_problem(Float8Spec(emulate=True), torch.device("cpu")) is None
