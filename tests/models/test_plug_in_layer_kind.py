"""A layer kind nxd does not ship (tests/models/toy_layer_kind.py, a depthwise-convolution mixer) registered from
outside nxd-models: the decoder builds, initialises, shards, counts and checks it through the registry alone, and it
trains under tensor parallelism and ZeRO-1 exactly as in one process."""

from __future__ import annotations

import pytest
import torch
from nxd_models import GPTConfig, ModelConfigError, model_family, register_layer_kind, unregister_layer_kind
from nxd_models.flops import training_flops_per_token
from nxd_parallel import Layout

from tests.models import toy_layer_kind
from tests.parallel.parity import Scenario, max_difference, plug_in_spec, run_scenarios, train_scenario

MODULE = toy_layer_kind.__name__
TOLERANCE = 1e-6


@pytest.fixture
def toy_kind():
    toy_layer_kind.ensure_registered()
    yield toy_layer_kind.KIND
    unregister_layer_kind(toy_layer_kind.KIND.name)


def test_the_registry_builds_initialises_shards_and_counts_a_plug_in_kind(toy_kind):
    spec = plug_in_spec(MODULE, layers=2, loss_chunk=0)
    family = model_family(spec)
    model = family.build(seed=0)
    mixer = model.model.layers[0]
    assert isinstance(mixer, toy_layer_kind.DepthwiseConvMixer)
    assert model.model.layers[1].__class__.__name__ == "DecoderLayer"
    # its own draw: torch's default bound for the convolution (U(+-1/sqrt(fan_in)), fan_in = width), and the output
    # projection drawn as an output layer: N(0, 0.02 / sqrt(2 x layers)) with use_scaled_init_method
    assert mixer.conv.weight.abs().max() <= 1 / 3**0.5 and mixer.conv.weight.std() > 0.2
    assert abs(mixer.out_proj.weight.std().item() - 0.02 / 2) < 0.002
    plan = family.tp_plan()
    assert plan["model.layers.0.input_layernorm"] == "sequence"
    assert "model.layers.0.self_attn.q_proj" not in plan and plan["model.layers.1.self_attn.q_proj"] == "colwise"
    # FLOPs: 6 x every linear weight + the dense layer's attention (12 x width x seq) + the convolution's weights
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    expected = 6 * linear + 12 * 32 * 16 + 6 * mixer.conv.weight.numel()
    assert training_flops_per_token(model, 16) == expected
    with pytest.raises(ModelConfigError, match="a GPT-NeoX checkpoint of gmlp, amlp, mamba, rwkv or toyconv layers"):
        family.neox_layout()


def test_a_plug_in_kind_checks_its_settings_and_names_are_refused_twice(toy_kind):
    spec = plug_in_spec(MODULE, layers=2, loss_chunk=0)
    with pytest.raises(ModelConfigError, match="a toyconv filter reads 1 or more positions, found 0"):
        GPTConfig(**{**spec.__dict__, "layer_settings": (toy_layer_kind.ToyConvSpec(width=0),)})
    with pytest.raises(ModelConfigError, match="expected kinds among dense, .*, rwkv, toyconv, found hyena"):
        GPTConfig(**{**spec.__dict__, "attention_layers": ("toyconv", "hyena")})
    with pytest.raises(ModelConfigError, match="layer kind 'toyconv' is registered already"):
        register_layer_kind(toy_kind)
    with pytest.raises(ModelConfigError, match="layer kind 'mamba' is not a registered plug-in kind"):
        unregister_layer_kind("mamba")


def test_once_unregistered_the_kind_is_refused_again():
    toy_layer_kind.ensure_registered()
    unregister_layer_kind(toy_layer_kind.KIND.name)
    with pytest.raises(ModelConfigError, match="expected kinds among dense, .*, mamba, rwkv, found toyconv"):
        GPTConfig(
            vocab_size=64,
            num_layers=1,
            hidden_size=32,
            num_attention_heads=4,
            seq_length=16,
            attention_layers=("toyconv",),
        )


LAYOUTS = [
    Scenario("toyconv-tp2", plug_in=MODULE, tp=2, clip=0.5),
    Scenario("toyconv-dp2-zero1", plug_in=MODULE, layout=Layout(zero1=True), clip=0.5),
]


@pytest.mark.parametrize("scenario", LAYOUTS, ids=lambda scenario: scenario.name)
def test_a_plug_in_kind_trains_in_two_processes_as_in_one(scenario, toy_kind, plug_in_runs):
    reference = train_scenario(Scenario("one", plug_in=MODULE, clip=scenario.clip, loss_chunk=0), world=1)
    record = plug_in_runs[scenario.name]
    for name, value in reference["init"].items():  # each shard is the slice of the one-process init
        assert torch.equal(record["init"][name], value), name
    differences = max_difference(reference, record)
    assert max(differences.values()) < TOLERANCE, (scenario.name, differences)
    assert all(step["model.layers.0.conv.weight"].abs().sum() > 0 for step in record["grads"])  # the kind trains


@pytest.fixture(scope="module")
def plug_in_runs() -> dict[str, dict]:
    """Both layouts in one pair of processes, each registering the kind itself."""
    return run_scenarios(2, LAYOUTS)
