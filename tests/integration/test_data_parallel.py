"""Data parallel with real processes on gloo, launched by the nxd-train command, against one process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train.test_profiler import profiled_steps
from tests.train.test_training_statistics import STATISTICS, assert_same_statistics
from tests.training_runs import FAST, losses, read_metrics, run_command


@pytest.mark.slow  # the default suite's data parallelism under torchrun below; nxd-train's own launch of DP2 in
# test_cluster_life (its uninterrupted run) and with ZeRO-1 in test_preference_parallel
@pytest.mark.parametrize("zero1", [False, True], ids=["replicated", "zero1"])
def test_two_processes_match_one_process(tmp_path, train_here, zero1):
    overrides = [
        "trainer.max_steps=5",
        "data.micro_batch_size=2",
        "data.global_batch_size=8",
        f"distributed_strategy.zero1={zero1}",
        *STATISTICS,
    ]
    single = [row for row in train_here(*overrides) if "loss" in row]  # 1 process x 4 micro-batches
    result = run_command(
        *FAST, *overrides, "trainer.devices=2", f"+exp_manager.explicit_log_dir={tmp_path / 'dp2'}", cwd=tmp_path
    )  # 2 processes x 2 micro-batches
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Warning" not in result.stderr  # torch's FSDP2 warns when the model's output is a view
    double = losses(read_metrics(tmp_path / "dp2"))
    assert len(single) == len(double) == 5
    assert max(abs(a - b) for a, b in zip(losses(single), double, strict=True)) < 1e-6
    print(assert_same_statistics(single, [row for row in read_metrics(tmp_path / "dp2") if "loss" in row]))
    assert sorted(p.name for p in (tmp_path / "dp2").glob("nxd_log_*")) == [
        "nxd_log_globalrank-0_localrank-0.txt",
        "nxd_log_globalrank-1_localrank-1.txt",
    ]


def test_torchrun_launches_the_same_job(tmp_path, train_here):
    """Two ZeRO-1 processes under torchrun, profiling step 2: the losses and training statistics of one process,
    a text log per rank, a trace per rank of step 2 only, and no warning."""
    overrides = [
        "trainer.max_steps=5",
        "data.micro_batch_size=2",
        "data.global_batch_size=8",
        "distributed_strategy.zero1=True",
        *STATISTICS,
    ]
    single_rows = [row for row in train_here(*overrides) if "loss" in row]  # 1 process x 4 micro-batches
    single = losses(single_rows)
    torchrun = Path(sys.executable).with_name("torchrun")
    profiled = [
        "+exp_manager.profiler.enabled=True",
        "+exp_manager.profiler.start_step=2",
        "+exp_manager.profiler.stop_step=2",
    ]
    result = subprocess.run(
        [
            str(torchrun),
            "--nproc_per_node",
            "2",
            "-m",
            "nxd_train",
            *FAST,
            *overrides,
            "trainer.devices=2",
            *profiled,
            f"+exp_manager.explicit_log_dir={tmp_path / 'torchrun'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "UserWarning" not in result.stderr  # torch's FSDP2 warns when the model's output is a view
    double = losses(read_metrics(tmp_path / "torchrun"))
    assert len(single) == len(double) == 5
    assert max(abs(a - b) for a, b in zip(single, double, strict=True)) < 1e-6  # the profiler changes nothing
    print(assert_same_statistics(single_rows, [row for row in read_metrics(tmp_path / "torchrun") if "loss" in row]))
    assert sorted(p.name for p in (tmp_path / "torchrun").glob("nxd_log_*")) == [
        "nxd_log_globalrank-0_localrank-0.txt",
        "nxd_log_globalrank-1_localrank-1.txt",
    ]
    for rank in (0, 1):  # one trace per rank, of step 2 only
        (trace,) = (tmp_path / "torchrun" / "profiler").glob(f"rank{rank}.*.pt.trace.json")
        assert profiled_steps(json.loads(trace.read_text())) == [2]
