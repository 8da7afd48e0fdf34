"""Command-line overrides: change, add (+), delete (~), YAML-typed values, clear errors."""

import pytest
from nxd_config import ConfigError, load_config

from .conftest import messages


def test_change_value_parsed_as_yaml(minimal) -> None:
    config = load_config(minimal, ["trainer.max_steps=50", "model.optim.lr=1e-4", "precision.type=bf16SR"])
    assert config.trainer.max_steps == 50
    assert config.model.optim.lr == pytest.approx(1e-4) and isinstance(config.model.optim.lr, float)
    assert config.precision.type == "bf16SR"


def test_change_to_list_mapping_and_null(minimal) -> None:
    minimal["data"]["data_prefix"] = "/a"
    config = load_config(
        minimal, ["data.data_prefix=[0.5, /a, 0.5, /b]", "+model.optim.betas=[0.8, 0.9]", "data.data_prefix=null"]
    )
    assert config.data.data_prefix is None and config.model.optim.betas == (0.8, 0.9)
    config = load_config(minimal, ["data.data_prefix={train: [1.0, /t], validation: /v}"])
    assert config.data.data_prefix.train == (1.0, "/t")


def test_override_may_interpolate(minimal) -> None:
    config = load_config(minimal, ["+data.seq_length=${model.encoder_seq_length}"])
    assert config.data.seq_length == 128


def test_add_key_the_file_lacks(minimal) -> None:
    config = load_config(minimal, ["+distributed_strategy.sequence_parallel=true", "+exp_manager.name=run1"])
    assert config.distributed_strategy.sequence_parallel is True
    assert config.exp_manager.name == "run1"


def test_delete_key(minimal) -> None:
    minimal["trainer"]["lnc"] = 2
    config = load_config(minimal, ["~trainer.lnc", "~data.global_batch_size"])
    assert config.trainer.lnc is None and config.data.global_batch_size is None


def test_changing_absent_key_needs_plus(minimal) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(minimal, ["trainer.gradient_clip_val=1.0"])
    assert messages(info.value) == [
        "trainer.gradient_clip_val: expected a key the file has for 'trainer.gradient_clip_val=...', "
        "found no such key in the file (use +trainer.gradient_clip_val=... to add it)"
    ]


def test_adding_present_key_is_an_error(minimal) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(minimal, ["+trainer.max_steps=5"])
    assert messages(info.value) == [
        "trainer.max_steps: expected a key the file lacks for '+trainer.max_steps=...', found it set in the "
        "file (use trainer.max_steps=... to change it)"
    ]


def test_deleting_absent_key_is_an_error(minimal) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(minimal, ["~trainer.lnc"])
    assert messages(info.value) == [
        "trainer.lnc: expected a key the file has for '~trainer.lnc', found no such key in the file"
    ]


@pytest.mark.parametrize("override", ["trainer.max_steps", "=5", "trainer..max_steps=5", "+=1", "~"])
def test_malformed_override(minimal, override) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(minimal, [override])
    [line] = messages(info.value)
    assert line.startswith(f"override {override!r}: expected ")


def test_override_errors_and_file_errors_reported_together(minimal) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(minimal, ["trainer.nope=1", "trainer.devices=abc"])
    assert messages(info.value) == [
        "trainer.nope: expected a key the file has or the config defines for 'trainer.nope=...', found no such key "
        "(nxd-train config keys lists every key)",
        "trainer.devices: expected an integer, found 'abc'",
    ]


def test_added_unknown_key_is_caught_by_the_schema(minimal) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(minimal, ["+trainer.max_step=5"])
    assert messages(info.value) == [
        "trainer.max_step: unknown key; expected a key that trainer defines (did you mean 'max_steps'?)"
    ]


def test_unparsable_override_value(minimal) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(minimal, ["trainer.max_steps=[1, 2"])
    [line] = messages(info.value)
    assert line.startswith("override 'trainer.max_steps=[1, 2': expected a YAML value, found '[1, 2' (")


@pytest.mark.parametrize(
    ("override", "advice"),
    [
        ("trainer.max_step=100", "found no such key (did you mean 'trainer.max_steps'?)"),  # a typo among its siblings
        ("max_steps=3", "found no such key (did you mean 'trainer.max_steps'?)"),  # the right name in another section
        ("trainer.log_every_n_step=5", "found no such key (did you mean 'trainer.log_every_n_steps'?)"),
    ],
)
def test_a_key_neither_in_the_file_nor_defined_gets_the_closest_key_never_plus(minimal, override, advice) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(minimal, [override])
    [line] = messages(info.value)
    assert line.endswith(advice) and "+" not in line


def test_a_defined_key_the_file_lacks_is_added_with_plus(minimal) -> None:
    """model.optim.momentum (an SGD key, defined under one choice) and the older spelling data.packing are the
    config's keys: the advice is to add them."""
    for key in ("trainer.log_every_n_steps", "model.optim.momentum", "data.packing"):
        with pytest.raises(ConfigError) as info:
            load_config(minimal, [f"{key}=1"])
        assert messages(info.value) == [
            f"{key}: expected a key the file has for '{key}=...', found no such key in "
            f"the file (use +{key}=... to add it)"
        ]
