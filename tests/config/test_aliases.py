"""Older NxDT spellings are read as the current ones, with a one-line deprecation notice."""

import pytest
from nxd_config import ConfigDeprecation, ConfigError, load_config

from .conftest import messages


def load_warning(config) -> tuple[object, list[str]]:
    with pytest.warns(ConfigDeprecation) as record:
        loaded = load_config(config)
    lines = [str(w.message) for w in record if issubclass(w.category, ConfigDeprecation)]
    assert all("\n" not in line for line in lines)
    return loaded, lines


def test_data_alignment_strategy_and_max_dpo_prompt_length(minimal) -> None:
    minimal["data"].update(
        train_dir="/d.jsonl", alignment_strategy={"dpo": {"kl_beta": 0.1, "max_dpo_prompt_length": 64}}
    )
    config, lines = load_warning(minimal)
    assert config.model_alignment_strategy.dpo.max_prompt_length == 64
    assert config.model_alignment_strategy.dpo.kl_beta == 0.1
    assert lines == [
        "'data.alignment_strategy' is the older spelling of 'model_alignment_strategy'; read as 'model_alignment_strategy'",
        "'model_alignment_strategy.dpo.max_dpo_prompt_length' is the older spelling of "
        "'model_alignment_strategy.dpo.max_prompt_length'; read as 'model_alignment_strategy.dpo.max_prompt_length'",
    ]


def test_exp_log_dir(minimal) -> None:
    minimal["exp_manager"] = {"exp_log_dir": "/logs/run"}
    config, lines = load_warning(minimal)
    assert config.exp_manager.explicit_log_dir == "/logs/run"
    assert lines == [
        "'exp_manager.exp_log_dir' is the older spelling of 'exp_manager.explicit_log_dir'; read as "
        "'exp_manager.explicit_log_dir'"
    ]


def test_mixed_precision_SR_value(minimal) -> None:
    minimal["precision"] = {"type": "mixed_precision_SR"}
    config, lines = load_warning(minimal)
    assert config.precision.type == "mixed_precisionSR"
    assert lines == [
        "precision.type: 'mixed_precision_SR' is the older spelling of 'mixed_precisionSR'; read as 'mixed_precisionSR'"
    ]


def test_data_packing(minimal) -> None:
    minimal["data"].update(train_dir="/d.jsonl", packing=True)
    config, lines = load_warning(minimal)
    assert config.model_alignment_strategy.sft.packing is True
    assert lines == [
        "'data.packing' is the older spelling of 'model_alignment_strategy.sft.packing'; read as "
        "'model_alignment_strategy.sft.packing'"
    ]


def test_fusions_do_layer_norm_weight_decay(minimal) -> None:
    minimal["model"]["fusions"] = {"do_layer_norm_weight_decay": True}
    config, lines = load_warning(minimal)
    assert config.model.do_layer_norm_weight_decay is True
    assert lines == [
        "'model.fusions.do_layer_norm_weight_decay' is the older spelling of 'model.do_layer_norm_weight_decay'; "
        "read as 'model.do_layer_norm_weight_decay'"
    ]


def test_old_and_new_spelling_together_is_an_error(minimal) -> None:
    minimal["exp_manager"] = {"exp_log_dir": "/a", "explicit_log_dir": "/b"}
    with pytest.raises(ConfigError) as info:
        load_config(minimal)
    assert messages(info.value) == [
        "exp_manager.exp_log_dir: expected only one of 'exp_manager.exp_log_dir' (older spelling) and "
        "'exp_manager.explicit_log_dir', found both set (keep 'exp_manager.explicit_log_dir')"
    ]


def test_override_may_use_the_file_spelling(minimal) -> None:
    minimal["exp_manager"] = {"exp_log_dir": "/a"}
    with pytest.warns(ConfigDeprecation):
        config = load_config(minimal, ["exp_manager.exp_log_dir=/b"])
    assert config.exp_manager.explicit_log_dir == "/b"
