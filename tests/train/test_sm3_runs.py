"""model.optim.name sm3 (GPT-NeoX's optimizer type sm3) in real runs: its accumulators, whose shapes are not the
parameters', are checkpointed and resumed exactly, in one process and from two ZeRO-1 processes into one."""

from __future__ import annotations

import pytest

from tests.train.test_checkpointing import SAVE, checkpoints
from tests.training_runs import FAST, losses, read_metrics, run_command

SM3 = ["model.optim.name=sm3", "~model.optim.betas", "model.optim.lr=0.01", "+model.optim.momentum=0.5", "trainer.max_steps=4", *SAVE,
       "+exp_manager.checkpoint_callback_params.every_n_train_steps=2"]  # fmt: skip


def test_sm3_resumes_exactly(tmp_path, train_here):
    whole = [row["loss"] for row in train_here(*SM3) if "loss" in row]
    resumed = train_here(*SM3, f"+exp_manager.resume_from_checkpoint={checkpoints(tmp_path / 'run0')[2]}")
    assert [row["loss"] for row in resumed if "loss" in row] == whole[2:]


@pytest.mark.slow  # the one-process resume above stays in the default suite
def test_two_zero1_processes_step_as_one_and_resume_in_one(tmp_path, train_here):
    job = [*SM3, "data.micro_batch_size=2", "data.global_batch_size=8"]
    single = [row["loss"] for row in train_here(*job) if "loss" in row]
    result = run_command(*FAST, *job, "trainer.devices=2", "distributed_strategy.zero1=True",
                         f"+exp_manager.explicit_log_dir={tmp_path / 'zero1'}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    double = losses(read_metrics(tmp_path / "zero1"))
    assert max(abs(a - b) for a, b in zip(single, double, strict=True)) < 1e-6
    resumed = train_here(*job, f"+exp_manager.resume_from_checkpoint={checkpoints(tmp_path / 'zero1')[2]}")
    assert max(abs(a - b) for a, b in zip([r["loss"] for r in resumed if "loss" in r], single[2:], strict=True)) < 1e-6
