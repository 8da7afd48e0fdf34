"""Loading from files and mappings, file-level errors, immutability and derived quantities."""

from pathlib import Path

import pydantic
import pytest
from nxd_config import ConfigError, NxdConfig, load_config

from .conftest import messages


def test_mapping_and_file_load_the_same(minimal, tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(minimal))
    assert load_config(path) == load_config(minimal)
    assert load_config(str(path)) == load_config(minimal)


def test_defaults_fill_what_the_file_omits(minimal) -> None:
    config = load_config(minimal)
    assert isinstance(config, NxdConfig)
    assert config.trainer.log_every_n_steps == 1
    assert config.exp_manager.checkpoint_callback_params.ranking == "max"  # monitor step: the newest
    assert config.distributed_strategy.context_parallel_size == 1
    assert config.model.optim.betas == (0.9, 0.999)


def test_one_load_does_not_leak_into_the_next(minimal) -> None:
    # interpolation resolves against shared defaults; a load must never change them
    first = dict(minimal, exp_manager={"checkpoint_callback_params": {"save_top_k": 5}})
    first["model"] = dict(minimal["model"], fusions={"flash_attention": "${model.fusions.softmax}"})
    assert load_config(first).exp_manager.checkpoint_callback_params.save_top_k == 5
    again = load_config(minimal)
    assert again.exp_manager.checkpoint_callback_params.save_top_k == 1
    assert again.model.fusions == type(again.model.fusions)()


def test_config_is_immutable(minimal) -> None:
    config = load_config(minimal)
    with pytest.raises(pydantic.ValidationError):
        config.trainer.max_steps = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        config.model.optim.betas.append(0.5)  # type: ignore[union-attr]


def test_derived_batch_arithmetic(minimal) -> None:
    # world 4, tp 2 -> dp 2; gbs 4 / (mbs 1 * dp 2) = 2 accumulation steps
    config = load_config(minimal)
    assert (config.world_size, config.data_parallel_size, config.gradient_accumulation_steps) == (4, 2, 2)
    del minimal["data"]["global_batch_size"]
    config = load_config(minimal)
    assert config.global_batch_size == 2 and config.gradient_accumulation_steps == 1


def test_lr_written_as_1e_minus_4_is_a_number(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "trainer: {max_steps: 1}\n"
        "model: {encoder_seq_length: 8, num_layers: 1, hidden_size: 8, num_attention_heads: 2,\n"
        "        optim: {name: adamw, lr: 1e-4, sched: {name: CosineAnnealing, min_lr: 3.0e-5}}}\n"
    )
    config = load_config(path)
    assert config.model.optim.lr == pytest.approx(1e-4)
    assert config.model.optim.sched.min_lr == pytest.approx(3e-5)


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.yaml")
    assert (
        str(info.value) == f"{tmp_path / 'nope.yaml'}: <root>: expected a YAML or JSON config file, found no such file"
    )


def test_directory_is_not_a_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected a YAML or JSON config file, found a directory"):
        load_config(tmp_path)


def test_yaml_syntax_error_gives_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("trainer:\n  devices: 1\n  max_steps: [1, 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert text.startswith(f"{path}: <root>: expected valid YAML, found ")
    assert "line 4" in text


def test_a_key_given_twice_names_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text("trainer:\n  max_steps: 3\n  devices: 1\n  max_steps: 4\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: <root>: expected valid YAML, found the key 'max_steps' twice in one mapping "
        "(first at line 2) at line 4, column 3"
    )


def test_yaml_merge_keys_still_merge(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text("base: &base\n  max_steps: 3\ntrainer:\n  <<: *base\n  devices: 1\n")
    from nxd_config.neox.files import read_file

    assert read_file(path)["trainer"] == {"max_steps": 3, "devices": 1}


def test_top_level_list_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping of keys at the top level, found a list"):
        load_config(path)


def test_interpolations_absolute_relative_and_multiply(minimal) -> None:
    minimal["model"]["max_position_embeddings"] = "${.encoder_seq_length}"
    minimal["model"]["optim"]["sched"] = {"name": "WarmupPolicy", "max_steps": "${trainer.max_steps}"}
    minimal["exp_manager"] = {
        "checkpoint_callback_params": {
            "model_parallel_size": (
                "${multiply:${distributed_strategy.tensor_model_parallel_size}, "
                "${distributed_strategy.pipeline_model_parallel_size}}"
            )
        }
    }
    config = load_config(minimal)
    assert config.model.max_position_embeddings == 128
    assert config.model.optim.sched.max_steps == 10
    # pipeline_model_parallel_size is not in the file: it resolves to its default, 1
    assert config.exp_manager.checkpoint_callback_params.model_parallel_size == 2


def test_broken_interpolations_are_all_reported(minimal) -> None:
    minimal["model"]["max_position_embeddings"] = "${model.no_such_key}"
    minimal["trainer"]["max_steps"] = "${multiply:2, abc}"
    with pytest.raises(ConfigError) as info:
        load_config(minimal)
    text = messages(info.value)
    assert text[0].startswith("trainer.max_steps: expected a resolvable value, found '${multiply:2, abc}'")
    assert "multiply takes numbers, found 'abc'" in text[0]
    assert text[1].startswith(
        "model.max_position_embeddings: expected a resolvable value, found '${model.no_such_key}'"
    )
