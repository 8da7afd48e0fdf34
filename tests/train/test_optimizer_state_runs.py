"""Optimizers whose state is not shaped as the parameters, in real runs: model.optim.name sm3 (GPT-NeoX's SM3, one
accumulator per axis) and adam8bit (bitsandbytes' 8-bit Adam, 8-bit codes with a scale per 256-value block). Their
state is checkpointed and resumed exactly, in one process and from two ZeRO-1 processes into one, and two processes
step as one."""

from __future__ import annotations

import sys

import pytest

from tests.train.test_checkpointing import SAVE, checkpoints
from tests.training_runs import FAST, losses, read_metrics, run_command

JOBS = {
    "sm3": ["model.optim.name=sm3", "~model.optim.betas", "model.optim.lr=0.01", "+model.optim.momentum=0.5"],
    "adam8bit": ["model.optim.name=adam8bit", "model.optim.lr=0.01", "+model.optim.min_8bit_size=256"],
}
CHECKPOINTED = ["trainer.max_steps=4", *SAVE, "+exp_manager.checkpoint_callback_params.every_n_train_steps=2"]


@pytest.mark.parametrize("optimizer", sorted(JOBS))
def test_the_state_resumes_exactly(optimizer, tmp_path, train_here):
    job = [*JOBS[optimizer], *CHECKPOINTED]
    whole = [row["loss"] for row in train_here(*job) if "loss" in row]
    resumed = train_here(*job, f"+exp_manager.resume_from_checkpoint={checkpoints(tmp_path / 'run0')[2]}")
    assert [row["loss"] for row in resumed if "loss" in row] == whole[2:]


@pytest.mark.slow  # the one-process resumes above and the parity scenarios stay in the default suite
@pytest.mark.parametrize("optimizer", sorted(JOBS))
def test_two_zero1_processes_step_as_one_and_resume_in_one(optimizer, tmp_path, train_here):
    job = [*JOBS[optimizer], *CHECKPOINTED, "data.micro_batch_size=2", "data.global_batch_size=8"]
    single = [row["loss"] for row in train_here(*job) if "loss" in row]
    result = run_command(
        *FAST,
        *job,
        "trainer.devices=2",
        "distributed_strategy.zero1=True",
        f"+exp_manager.explicit_log_dir={tmp_path / 'zero1'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    double = losses(read_metrics(tmp_path / "zero1"))
    assert max(abs(a - b) for a, b in zip(single, double, strict=True)) < 1e-6
    resumed = train_here(*job, f"+exp_manager.resume_from_checkpoint={checkpoints(tmp_path / 'zero1')[2]}")
    assert max(abs(a - b) for a, b in zip([r["loss"] for r in resumed if "loss" in r], single[2:], strict=True)) < 1e-6


def test_without_bitsandbytes_adam8bit_is_refused_before_launch(tmp_path, monkeypatch):
    from nxd_config import load_config
    from nxd_train.checks.preflight import PreflightError, plan_run
    from nxd_train.cli import default_config_path
    from nxd_train.run.corpus import default_cache_dir

    monkeypatch.setitem(sys.modules, "bitsandbytes.functional", None)  # as where the extra is not installed
    cfg = load_config(default_config_path(), [f"+exp_manager.explicit_log_dir={tmp_path}", "model.optim.name=adam8bit"])
    with pytest.raises(PreflightError) as caught:
        plan_run(cfg, default_cache_dir())
    assert caught.value.problems == [
        "model.optim.name: adam8bit expected the bitsandbytes package, found it not "
        "installed; install nxd-train[bnb] (pip install bitsandbytes)"
    ]
