"""model.optim.name adam8bit (bitsandbytes' 8-bit Adam; GPT-NeoX's use_bnb_optimizer) in real runs: its 8-bit
moments and their block scales are checkpointed and resumed exactly, in one process and from two ZeRO-1 processes
into one, and two processes step as one."""

from __future__ import annotations

import pytest

from tests.train.test_checkpointing import SAVE, checkpoints
from tests.training_runs import FAST, losses, read_metrics, run_command

ADAM8BIT = ["model.optim.name=adam8bit", "model.optim.lr=0.01", "+model.optim.min_8bit_size=256",
            "trainer.max_steps=4", *SAVE, "+exp_manager.checkpoint_callback_params.every_n_train_steps=2"]  # fmt: skip


def test_adam8bit_resumes_exactly(tmp_path, train_here):
    whole = [row["loss"] for row in train_here(*ADAM8BIT) if "loss" in row]
    resumed = train_here(*ADAM8BIT, f"+exp_manager.resume_from_checkpoint={checkpoints(tmp_path / 'run0')[2]}")
    assert [row["loss"] for row in resumed if "loss" in row] == whole[2:]


@pytest.mark.slow  # the one-process resume above and the TP2 parity scenario stay in the default suite
def test_two_zero1_processes_step_as_one_and_resume_in_one(tmp_path, train_here):
    job = [*ADAM8BIT, "data.micro_batch_size=2", "data.global_batch_size=8"]
    single = [row["loss"] for row in train_here(*job) if "loss" in row]
    result = run_command(*FAST, *job, "trainer.devices=2", "distributed_strategy.zero1=True",
                         f"+exp_manager.explicit_log_dir={tmp_path / 'zero1'}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    double = losses(read_metrics(tmp_path / "zero1"))
    assert max(abs(a - b) for a, b in zip(single, double, strict=True)) < 1e-6
    resumed = train_here(*job, f"+exp_manager.resume_from_checkpoint={checkpoints(tmp_path / 'zero1')[2]}")
    assert max(abs(a - b) for a, b in zip([r["loss"] for r in resumed if "loss" in r], single[2:], strict=True)) < 1e-6


def test_without_bitsandbytes_the_run_is_refused_before_launch(tmp_path, monkeypatch):
    import sys

    from nxd_config import load_config
    from nxd_train.cli import default_config_path
    from nxd_train.corpus import default_cache_dir
    from nxd_train.preflight import PreflightError, plan_run

    monkeypatch.setitem(sys.modules, "bitsandbytes.functional", None)  # as where the extra is not installed
    cfg = load_config(default_config_path(), [f"+exp_manager.explicit_log_dir={tmp_path}", "model.optim.name=adam8bit"])
    with pytest.raises(PreflightError) as caught:
        plan_run(cfg, default_cache_dir())
    assert caught.value.problems == ["model.optim.name: adam8bit expected the bitsandbytes package, found it not "
                                     "installed; install nxd-train[bnb] (pip install bitsandbytes)"]
