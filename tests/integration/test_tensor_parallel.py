"""Tensor + sequence parallel through the nxd-train command (2 gloo processes) against one process:
losses, the logged gradient norm and parameter norm, with selective recomputation on."""

from __future__ import annotations

import pytest

from tests.train.test_training_statistics import STATISTICS, assert_same_statistics
from tests.training_runs import FAST, read_metrics, run_command


@pytest.mark.slow  # tests/parallel/test_parity.py's hf-tp2-sp and test_sft_parallel's tp2_sp in the default suite
def test_tp2_with_sequence_parallel_logs_what_one_process_logs(tmp_path, train_here):
    overrides = [
        "trainer.max_steps=5",
        "data.micro_batch_size=2",
        "data.global_batch_size=8",
        "+exp_manager.log_parameter_norm=True",
        "trainer.gradient_clip_val=0.5",
        "model.activations_checkpoint_granularity=selective",
        "+model.activations_checkpoint_recompute=[CoreAttention]",
        *STATISTICS,
    ]
    single = [row for row in train_here(*overrides) if "loss" in row]
    result = run_command(
        *FAST,
        *overrides,
        "trainer.devices=2",
        "distributed_strategy.tensor_model_parallel_size=2",
        "distributed_strategy.sequence_parallel=True",
        f"+exp_manager.explicit_log_dir={tmp_path / 'tp2'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "(tp 2)" in result.stdout + result.stderr
    double = [row for row in read_metrics(tmp_path / "tp2") if "loss" in row]
    assert len(single) == len(double) == 5
    for key in ("loss", "grad_norm", "param_norm"):
        assert max(abs(a[key] - b[key]) for a, b in zip(single, double, strict=True)) < 1e-6, (
            key,
            [a[key] for a in single],
            [b[key] for b in double],
        )
    print(assert_same_statistics(single, double))
