"""Per-key validation: types, allowed values, ranges, unknown keys, and reporting all at once."""

import pytest
from nxd_config import ConfigError, load_config

from .conftest import messages


def error_lines(config) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(config)
    return messages(info.value)


def test_wrong_type_unknown_key_and_cross_field_rule_reported_together(minimal) -> None:
    minimal["trainer"]["devices"] = "four"  # wrong type
    minimal["trainer"]["max_step"] = 3  # unknown key
    minimal["model"]["activations_checkpoint_recompute"] = ["CoreAttention"]  # needs selective
    lines = error_lines(minimal)
    assert lines == [
        "trainer.devices: expected an integer, found 'four'",
        "trainer.max_step: unknown key; expected a key that trainer defines (did you mean 'max_steps'?)",
        "model.activations_checkpoint_recompute: expected null unless activations_checkpoint_granularity "
        "is 'selective', found ['CoreAttention'] with granularity None",
    ]


def test_rule_depending_on_an_invalid_key_is_not_reported(minimal) -> None:
    # dp depends on trainer.devices; with devices invalid, the batch rule cannot be judged
    minimal["trainer"]["devices"] = "four"
    minimal["data"]["global_batch_size"] = 3
    assert error_lines(minimal) == ["trainer.devices: expected an integer, found 'four'"]


def test_error_names_the_file(minimal, tmp_path) -> None:
    import yaml

    minimal["trainer"]["devices"] = 0
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(minimal))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: trainer.devices: expected a value >= 1, found 0"


def test_unknown_key_found_in_another_section_is_suggested(minimal) -> None:
    minimal["trainer"]["zero1"] = True
    assert error_lines(minimal) == [
        "trainer.zero1: unknown key; expected a key that trainer defines (did you mean 'distributed_strategy.zero1'?)"
    ]


def test_unknown_top_level_section(minimal) -> None:
    minimal["trainr"] = {}
    assert error_lines(minimal) == [
        "trainr: unknown key; expected a key that the top level defines (did you mean 'trainer'?)"
    ]


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("trainer", "max_steps", 2.5, "expected an integer, found 2.5"),
        ("trainer", "max_steps", True, "expected an integer, found True"),
        ("distributed_strategy", "zero1", "yes please", "expected true or false, found 'yes please'"),
        ("distributed_strategy", "kv_replicator", True, "expected an integer, found True"),
        ("trainer", "gradient_clip_val", -1.0, "expected a value >= 0.0, found -1.0"),
        (
            "trainer",
            "limit_val_batches",
            1.5,
            "expected an integer >= 0 (batches) or a number from 0.0 to 1.0 (fraction), found 1.5",
        ),
        (
            "trainer",
            "val_check_interval",
            0,
            "expected an integer >= 1 (steps) or a number in (0, 1] (fraction of an epoch), found 0",
        ),
        ("trainer", "lnc", 3, "expected a value <= 2, found 3"),
        (
            "precision",
            "type",
            "bf16",
            "expected one of 'fp32', 'bf16SR', 'autocast', 'mixed_precision', "
            "'mixed_precisionSR', 'fp16', 'fp16_autocast' or 'manual', found 'bf16' (did you mean 'bf16SR'?)",
        ),
        (
            "model",
            "normalization",
            "batchnorm",
            "expected one of 'rmsnorm', 'layernorm', 'scalenorm' or 'non_parametric_layernorm', found 'batchnorm'",
        ),
        ("data", "splits_string", "a,b", "expected comma-separated numbers such as '980,10,10', found 'a,b'"),
        (
            "data",
            "data_prefix",
            [0.5, "/a", 0.5],
            "expected [weight, prefix, weight, prefix, ...] pairs, found 3 items",
        ),
        ("data", "dataloader_type", "random", "expected one of 'single' or 'cyclic', found 'random'"),
    ],
)
def test_type_and_value_messages(minimal, section, key, value, message) -> None:
    minimal.setdefault(section, {})[key] = value
    assert error_lines(minimal) == [f"{section}.{key}: {message}"]


def test_limit_batches_int_counts_float_fractions(minimal) -> None:
    minimal["trainer"].update(limit_val_batches=5, limit_test_batches=0.25)
    config = load_config(minimal)
    assert config.trainer.limit_val_batches == 5 and isinstance(config.trainer.limit_val_batches, int)
    assert config.trainer.limit_test_batches == 0.25


def test_unknown_optimizer_name_suggests_the_closest(minimal) -> None:
    minimal["model"]["optim"]["name"] = "adamW"
    assert error_lines(minimal) == [
        "model.optim.name: expected one of adamw, adamw_fp32OptState, sgd, adam, adadelta, adamax, "
        "adagrad, rmsprop, rprop, novograd, adafactor, lion, madgrad_wd, sm3, adam8bit, found 'adamW' (did you mean 'adamw'?)"
    ]


def test_parameter_of_another_optimizer_is_unknown(minimal) -> None:
    minimal["model"]["optim"]["momentum"] = 0.9  # an SGD parameter on adamw
    assert error_lines(minimal) == ["model.optim.momentum: unknown key; expected a key that model.optim defines"]


def test_nested_value_error_names_list_index(minimal) -> None:
    minimal["model"]["optim"]["betas"] = [0.9, "x"]
    assert error_lines(minimal) == ["model.optim.betas[1]: expected a number, found 'x'"]


def test_betas_must_be_a_pair(minimal) -> None:
    minimal["model"]["optim"]["betas"] = [0.9]
    assert error_lines(minimal) == ["model.optim.betas: expected a list of 2 items (found 1), found [0.9]"]


def test_rprop_as_scheduler_is_explained(minimal) -> None:
    minimal["model"]["optim"]["sched"] = {"name": "rprop"}
    [line] = error_lines(minimal)
    assert line.startswith("model.optim.sched: expected a scheduler name, found 'rprop'")
    assert "set model.optim.name: rprop instead" in line


def test_rprop_takes_no_weight_decay(minimal) -> None:
    minimal["model"]["optim"] = {"name": "rprop", "lr": 0.01, "weight_decay": 0.1}
    assert error_lines(minimal) == ["model.optim.weight_decay: unknown key; expected a key that model.optim defines"]


def test_required_scheduler_parameter(minimal) -> None:
    minimal["model"]["optim"]["sched"] = {"name": "StepLR"}
    assert error_lines(minimal) == ["model.optim.sched.step_size: expected a value (this key is required)"]


def test_warmup_steps_and_ratio_are_exclusive(minimal) -> None:
    minimal["model"]["optim"]["sched"] = {"name": "WarmupPolicy", "warmup_steps": 5, "warmup_ratio": 0.1}
    assert error_lines(minimal) == ["model.optim.sched: expected warmup_steps or warmup_ratio, found both set"]


@pytest.mark.parametrize(
    "optim",
    [
        {"name": "adamw", "lr": 3e-4, "betas": [0.9, 0.95], "capturable": True, "weight_decay": 0.1},
        {"name": "adamw_fp32OptState", "lr": 3e-4, "eps": 1e-6},
        {"name": "adam", "lr": 1e-3, "amsgrad": True},
        {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True},
        {"name": "adadelta", "lr": 1.0, "rho": 0.95},
        {"name": "adamax", "lr": 2e-3},
        {"name": "adagrad", "lr": 0.01, "lr_decay": 0.001},
        {"name": "rmsprop", "lr": 0.01, "alpha": 0.9, "centered": True},
        {"name": "rprop", "lr": 0.01, "etas": [0.4, 1.3], "step_sizes": [1e-6, 10]},
        {"name": "novograd", "lr": 0.01, "betas": [0.95, 0.98], "luc": True},
        {"name": "adafactor", "lr": None, "relative_step": True, "warmup_init": True},
    ],
)
def test_every_documented_optimizer_loads(minimal, optim) -> None:
    minimal["model"]["optim"] = optim
    assert load_config(minimal).model.optim.name == optim["name"]


@pytest.mark.parametrize(
    "sched",
    [
        {"name": "LinearAnnealingWithWarmUp", "warmup_steps": 100, "max_steps": 1000},
        {"name": "CosineAnnealing", "warmup_steps": 10, "constant_steps": 0, "min_lr": 1e-5},
        {"name": "WarmupPolicy", "warmup_ratio": 0.1},
        {"name": "WarmupHoldPolicy", "warmup_steps": 10, "hold_steps": 20, "min_lr": 0.0},
        {"name": "SquareAnnealing", "warmup_steps": 5},
        {"name": "NoamAnnealing", "d_model": 512, "warmup_steps": 4000},
        {"name": "WarmupAnnealing", "warmup_ratio": 0.05},
        {"name": "StepLR", "step_size": 100, "gamma": 0.5},
        {"name": "ExponentialLR", "gamma": 0.99},
    ],
)
def test_every_documented_scheduler_loads(minimal, sched) -> None:
    minimal["model"]["optim"]["sched"] = sched
    assert load_config(minimal).model.optim.sched.name == sched["name"]


def test_adafactor_needs_lr_or_relative_step(minimal) -> None:
    minimal["model"]["optim"] = {"name": "adafactor"}
    assert error_lines(minimal) == ["model.optim: expected lr to be set, or relative_step: True, found neither"]


def test_blend_forms(minimal) -> None:
    for prefix in (
        "/data/a",
        ["/data/a"],
        [0.3, "/data/a", 0.7, "/data/b"],
        {"train": [1.0, "/data/a"], "validation": "/data/v", "test": ["/data/t"]},
    ):
        minimal["data"]["data_prefix"] = prefix
        load_config(minimal)
    minimal["data"]["data_prefix"] = [0, "/data/a"]
    assert error_lines(minimal) == ["data.data_prefix: expected at least one positive weight, found all weights 0"]


def test_runtime_flags_accept_strings_and_integers(minimal) -> None:
    minimal["precision"] = {"type": "manual", "xla_downcast_bf16": 1, "neuron_rt_stochastic_rounding_en": "1"}
    config = load_config(minimal)
    assert (config.precision.xla_downcast_bf16, config.precision.neuron_rt_stochastic_rounding_en) == ("1", "1")


def test_alignment_block_present_but_empty_selects_the_method(minimal) -> None:
    minimal["data"]["train_dir"] = "/data/sft.jsonl"
    minimal["model_alignment_strategy"] = {"sft": None}
    config = load_config(minimal)
    assert config.model_alignment_strategy.method == "sft"
    assert config.model_alignment_strategy.sft.packing is False


def test_a_misspelt_choice_is_suggested(minimal) -> None:
    minimal["precision"] = {"type": "mixed_precison"}
    assert error_lines(minimal) == [
        "precision.type: expected one of 'fp32', 'bf16SR', 'autocast', 'mixed_precision', 'mixed_precisionSR', "
        "'fp16', 'fp16_autocast' or 'manual', found 'mixed_precison' (did you mean 'mixed_precision'?)"
    ]
