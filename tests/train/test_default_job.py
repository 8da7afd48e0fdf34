"""`nxd-train` with no arguments: the embedded tiny config trains and the loss falls."""

from __future__ import annotations

import os

from tests.training_runs import losses, read_metrics, run_command


def test_default_job_trains_and_says_where_the_logs_are(tmp_path, monkeypatch):
    tools = tmp_path / "bin"  # an srun on the PATH, as on a Slurm login node: Lightning's hint about it is not shown
    tools.mkdir()
    (tools / "srun").write_text("#!/bin/sh\nexit 0\n")
    (tools / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    result = run_command(cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    log_dir = tmp_path / "nxd_logs" / "tiny_llama" / "version_0"
    assert f"done: 300 steps; logs in {log_dir}" in result.stdout
    rows = read_metrics(log_dir)
    curve = losses(rows)
    assert len(curve) == 12  # every 25 steps
    assert curve[-1] < curve[0] - 1.5  # from ln(4096) = 8.3 to well below
    assert [row["step"] for row in rows if "val_loss" in row] == [100.0, 200.0, 300.0]
    assert list((log_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert "step 300/300 | loss" in result.stdout
    assert "srun" not in result.stdout + result.stderr
    assert (
        "pretraining" in result.stdout
        and "the built-in corpus (Python's standard library), its BPE of 4096 tokens" in result.stdout
    )  # a config naming no data says what the run trains on
