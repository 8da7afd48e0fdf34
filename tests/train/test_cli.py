"""The nxd-train command line: config show / check, the default job, help."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from nxd_train.cli import default_config_path, main

ROOT = Path(__file__).resolve().parents[2]


def test_default_config_is_configs_tiny() -> None:
    assert default_config_path().read_bytes() == (ROOT / "configs" / "tiny.yaml").read_bytes()


def test_config_check_valid(capsys) -> None:
    assert main(["config", "check", str(ROOT / "configs" / "tiny.yaml")]) == 0
    assert "valid (1 process: tp=1 pp=1 cp=1 dp=1, gradient accumulation 2)" in capsys.readouterr().out


def test_config_check_lists_every_problem_and_exits_1(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "configs" / "tiny.yaml").read_text().replace("devices: 1", "devices: one"))
    assert main(["config", "check", str(bad), "trainer.max_stepz=3", "+trainer.lnc=7"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"3 problems in the config:\n  {bad}: trainer.max_stepz: expected a key the file has")
    assert f"{bad}: trainer.devices: expected an integer, found 'one'" in err
    assert f"{bad}: trainer.lnc: expected a value <= 2, found 7" in err


def test_config_show_prints_resolved_yaml_with_overrides(capsys) -> None:
    assert main(["config", "show", str(ROOT / "configs" / "tiny.yaml"), "trainer.max_steps=7"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["trainer"]["max_steps"] == 7
    assert shown["model"]["optim"]["sched"]["max_steps"] == 7  # ${trainer.max_steps} resolved
    assert shown["model"]["max_position_embeddings"] == 64  # ${.encoder_seq_length} resolved
    assert shown["exp_manager"]["checkpoint_callback_params"]["save_top_k"] == 1


def test_config_check_runs_the_preflight_and_notes_neuron_only_keys(capsys) -> None:
    """A file the schema accepts but training would refuse here is not called runnable: every problem
    of training's preflight is listed at once (here a missing tokenizer); a CUDA-only optimizer option is a
    notice."""
    assert main(["config", "check", str(ROOT / "configs" / "megatron_llama_7B.yaml")]) == 1
    captured = capsys.readouterr()
    assert "valid (" in captured.out
    assert (
        "notice: acted on only on AWS Neuron devices: exp_manager.save_xser, exp_manager.load_xser, "
        "compiler_flags, compiler_cache_url" in captured.err
    )
    problems = captured.err.split("would stop a run on this machine:\n")[1].splitlines()
    assert [line.split(":")[0].strip() for line in problems] == ["data.tokenizer.type"]
    assert "notice: model.optim.capturable: True matters to CUDA graph capture only" in captured.err


def test_deprecation_notice_is_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "old.yaml"
    path.write_text((ROOT / "configs" / "tiny.yaml").read_text().replace("type: fp32", "type: mixed_precision_SR"))
    assert main(["config", "check", str(path)]) == 0
    assert (
        "notice: precision.type: 'mixed_precision_SR' is the older spelling of 'mixed_precisionSR'; "
        "read as 'mixed_precisionSR'\n"
    ) in capsys.readouterr().err


def test_train_with_config_and_overrides(tmp_path: Path, capsys) -> None:
    assert (
        main(
            [
                "--config",
                str(ROOT / "configs" / "tiny.yaml"),
                "trainer.max_steps=3",
                "trainer.log_every_n_steps=1",
                f"+exp_manager.explicit_log_dir={tmp_path}",
                "exp_manager.create_tensorboard_logger=False",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "step 3/3 | loss" in out and f"done: 3 steps; logs in {tmp_path}" in out
    assert "host memory: " in out  # trainer.keep_freed_host_memory: what is in effect on the CPU
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["trainer"]["max_steps"] == 3


def test_train_refuses_what_it_cannot_do_before_launch(capsys) -> None:
    assert main(["precision.type=manual", "+precision.xla_use_bf16=1", "+precision.xla_downcast_bf16=1"]) == 1
    err = capsys.readouterr().err
    assert err.endswith(
        "tiny.yaml: cannot train this config:\n  precision.xla_use_bf16 and precision.xla_downcast_bf16: "
        "expected at most one of them '1' (bf16 parameters, or bf16 compute over fp32 parameters), "
        "found both\n"
    )


def test_missing_config_file_exits_1(tmp_path: Path, capsys) -> None:
    assert main(["config", "check", str(tmp_path / "none.yaml")]) == 1
    assert (
        capsys.readouterr().err
        == f"{tmp_path / 'none.yaml'}: <root>: expected a YAML or JSON config file, found no such file\n"
    )


@pytest.mark.parametrize("argv", [["--help"], ["config", "--help"], ["config", "check", "--help"]])
def test_help(argv, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    assert "usage: nxd-train" in capsys.readouterr().out


def test_help_explains_subcommands(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "train" in out and "config" in out and "+a.b=VALUE adds one" in out


def test_installed_entry_point(capsys) -> None:
    """The installed command reads a recipe; its check (the same code in this process) names what this machine
    lacks."""
    recipe = str(ROOT / "configs" / "hf_llama3_8B_DPO.yaml")
    shown = subprocess.run(
        [Path(sys.executable).parent / "nxd-train", "config", "show", recipe], capture_output=True, text=True
    )
    assert shown.returncode == 0 and "tensor_model_parallel_size: 32" in shown.stdout, shown.stderr
    assert main(["config", "check", recipe]) == 1
    out, err = capsys.readouterr()
    assert "valid (32 processes" in out and "would stop a run on this machine:" in err
    assert "qkv_linear" not in err  # HF models take NxDT's QKV module too
    assert "found no directory at /data/pretrained_ckpt" in err  # what this machine lacks, by key


def test_a_config_file_may_be_named_without_its_flag(tmp_path: Path, capsys) -> None:
    """`nxd-train FILE.yaml [overrides]` reads like `--config FILE.yaml`; overrides ending in .yaml stay overrides."""
    assert (
        main(
            [
                str(ROOT / "configs" / "tiny.yaml"),
                "trainer.max_steps=2",
                f"+exp_manager.explicit_log_dir={tmp_path}",
                "exp_manager.create_tensorboard_logger=False",
            ]
        )
        == 0
    )
    assert "done: 2 steps" in capsys.readouterr().out
    assert main(["train", str(tmp_path / "missing.yaml")]) == 1
    assert "missing.yaml" in capsys.readouterr().err
