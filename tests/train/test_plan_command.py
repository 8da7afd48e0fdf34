"""`nxd-train plan`: each rank's memory before launch, the verdict, and the keys that would make it fit."""

from __future__ import annotations

import pytest
from nxd_config import load_config
from nxd_parallel import GIB
from nxd_train.checks import memory as memory_check
from nxd_train.checks.preflight import plan_run
from nxd_train.cli import default_config_path, main
from nxd_train.run.corpus import default_cache_dir

LONG = ["model.encoder_seq_length=1024", "data.micro_batch_size=4", "data.global_batch_size=8"]


@pytest.fixture
def no_runtime(monkeypatch):
    """Plans without this test process's own resident memory, so that the figures are the tensors'."""
    monkeypatch.setattr(memory_check, "runtime_bytes", lambda device: 0)


def test_a_config_that_fits_prints_each_part_and_exits_0(capsys):
    assert main(["plan", str(default_config_path())]) == 0
    out = capsys.readouterr().out
    assert "| pipeline stage | parameters | gradients | master weights | optimizer state | activations |" in out
    assert ": fits" in out


@pytest.mark.parametrize(
    "wider, names",
    [
        ([], ["model.fusions.loss_chunk_tokens: 1024", "data.micro_batch_size: 2"]),  # the logits dominate
        (
            ["model.hidden_size=512", "model.ffn_hidden_size=1408", "model.num_layers=4"],  # the activations dominate
            ["model.activations_checkpoint_granularity: full", "data.micro_batch_size: 2"],
        ),
    ],
)
def test_a_layout_that_does_not_fit_names_the_changes_that_would(capsys, no_runtime, tmp_path, wider, names):
    overrides = [*LONG, *wider]
    cfg = load_config(default_config_path(), [*overrides, f"+exp_manager.explicit_log_dir={tmp_path}"])
    rank = memory_check.rank_memory(plan_run(cfg, default_cache_dir()), runtime=0)[0]
    limit = int((rank.total - max(rank.activations, rank.loss) / 3) / GIB * 100) / 100
    assert main(["plan", str(default_config_path()), *overrides, "--device-memory", str(limit)]) == 1
    out = capsys.readouterr().out
    assert f"peak {rank.total / GIB:.2f} GiB per rank against {limit:.2f} GiB (given): does not fit" in out
    assert all(name in out.rpartition("would fit with: ")[2] for name in names), out


def test_training_warns_at_start_when_the_plan_does_not_fit(capsys, no_runtime, monkeypatch, tmp_path):
    monkeypatch.setattr(memory_check, "available_memory", lambda plan, device, given=None: (1, "a 1-byte device"))
    assert main(["trainer.max_steps=1", f"+exp_manager.explicit_log_dir={tmp_path}"]) == 0
    assert "notice: memory plan: peak" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["plan", "tune", "launch"])
def test_a_bad_device_memory_is_refused_by_name(capsys, command):
    for value in ("-5", "0", "nan", "inf", "lots"):
        with pytest.raises(SystemExit) as caught:
            main([command, str(default_config_path()), "--device-memory", value])
        assert caught.value.code == 2
        assert (
            f"argument --device-memory: expected a positive number of GiB, found '{value}'" in capsys.readouterr().err
        )
