"""The conventions a command line user expects of nxd-train: --version, did-you-mean for a mistyped command,
option, choice or key (never suggesting `+typo`), the positional config files in --help, the example configs
shipped in the wheel (config list / copy), config show with no file, and config keys."""

import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from nxd_train.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_version_lists_every_nxd_package(capsys) -> None:
    """Each package's line carries the version its pyproject declares."""
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out.splitlines()
    for pyproject in [*ROOT.glob("packages/*/pyproject.toml"), ROOT / "apps" / "nxd-train" / "pyproject.toml"]:
        project = tomllib.loads(pyproject.read_text())["project"]
        assert f"{project['name']} {project['version']}" in out
    assert f"torch {version('torch')}" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["trian"],
            "nxd-train: unknown command 'trian' (did you mean 'train'?); expected one of train, config, plan, "
            "tune, launch, generate, eval, data, ckpt, plot",
        ),
        (["confg", "show"], "nxd-train: unknown command 'confg' (did you mean 'config'?)"),
        (["train", "--dialet", "neox"], "nxd-train train: unknown option --dialet (did you mean --dialect?)"),
        (
            ["eval", "configs/tiny.yaml", "--num-fewshots", "2"],
            "nxd-train eval: unknown option --num-fewshots (did you mean --num-fewshot?)",
        ),
        (
            ["banana"],
            "nxd-train: 'banana': expected a command (train, config, plan, tune, launch, generate, eval, data, "
            "ckpt, plot), "
            "a config file (.yaml, .yml or .json) or an override (KEY=VALUE), found none of them",
        ),
    ],
)
def test_a_mistyped_command_or_option_gets_the_closest_one(argv, message, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and "tiny.yaml" not in err and "+" not in err


def test_a_mistyped_choice_gets_the_closest_one(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["config", "shw"])
    assert stop.value.code == 2
    assert "invalid choice: 'shw' (did you mean 'show'?); expected one of show, check" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["trainer.max_step=100"], ["--trainer.max_step", "100"]])
def test_a_mistyped_key_gets_did_you_mean_never_plus(argv, capsys) -> None:
    assert main(["config", "show", *argv]) == 1
    err = capsys.readouterr().err
    assert "trainer.max_step: expected a key the file has or the config defines" in err
    assert "(did you mean 'trainer.max_steps'?)" in err and "+trainer.max_step" not in err


def test_train_help_shows_the_config_files(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "[FILE|OVERRIDE ...]" in out and "config files (one NxDT or QEfficient file, or GPT-NeoX" in out


def test_config_show_without_a_file_prints_the_default(capsys) -> None:
    assert main(["config", "show", "trainer.max_steps=9"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["name"] == "tiny_llama" and shown["trainer"]["max_steps"] == 9


def test_config_list_names_every_example_of_each_dialect(capsys) -> None:
    assert main(["config", "list"]) == 0
    rows = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()[:-2] if line}
    shipped = {p.relative_to(ROOT / "configs").with_suffix("").as_posix() for p in (ROOT / "configs").rglob("*.y*ml")}
    assert set(rows) == shipped
    assert rows["tiny"] == "NxDT" and rows["neox/pythia_tiny"] == "GPT-NeoX"
    assert rows["qeff/sft_ddp_config"] == "QEfficient"


def test_config_copy_writes_a_new_file_and_never_replaces_one(tmp_path: Path, capsys) -> None:
    assert main(["config", "copy", "qeff/sft_ddp_config", str(tmp_path)]) == 0
    copied = tmp_path / "sft_ddp_config.yaml"
    assert copied.read_bytes() == (ROOT / "configs" / "qeff" / "sft_ddp_config.yaml").read_bytes()
    copied.write_text("mine")
    assert main(["config", "copy", "qeff/sft_ddp_config.yaml", str(copied)]) == 1
    assert copied.read_text() == "mine"
    assert "exists; expected a new file (nxd-train never replaces one)" in capsys.readouterr().err
    assert main(["config", "copy", "megatron_lama_7B", str(tmp_path / "x.yaml")]) == 1
    assert "found no such example (did you mean 'megatron_llama_7B'" in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists()


def test_config_keys_lists_type_default_and_help(capsys) -> None:
    assert main(["config", "keys", "trainer.max_steps"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "trainer.max_steps  (int; default -1)",
        "    Maximum optimizer steps; -1 means the length is set by max_epochs alone",
    ]
    assert main(["config", "keys", "model.optim"]) == 0
    keys = [line.split()[0] for line in capsys.readouterr().out.splitlines() if not line.startswith(" ")]
    assert "model.optim.lr" in keys and "model.optim[sgd].momentum" in keys
    assert main(["config", "keys", "traner"]) == 1
    assert "(did you mean 'trainer'?)" in capsys.readouterr().err
