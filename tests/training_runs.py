"""Helpers that run nxd-train on the embedded tiny config, in this process or as the real command.

The `train_here` fixture (tests/conftest.py) wraps `train_in_process`."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from nxd_config import load_config
from nxd_train.cli import default_config_path
from nxd_train.corpus import default_cache_dir
from nxd_train.loop import train
from nxd_train.preflight import plan_run

FAST = ["trainer.log_every_n_steps=1", "exp_manager.create_tensorboard_logger=False", "trainer.limit_val_batches=0"]


def read_metrics(log_dir: Path) -> list[dict[str, float]]:
    with open(log_dir / "metrics.csv") as handle:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(handle)]


def losses(rows: list[dict[str, float]]) -> list[float]:
    return [row["loss"] for row in rows if "loss" in row]


def train_in_process(log_dir: Path, *overrides: str) -> list[dict[str, float]]:
    """Train the tiny config in this process (one process) with overrides; returns the metrics rows."""
    cfg = load_config(default_config_path(), [*FAST, f"+exp_manager.explicit_log_dir={log_dir}", *overrides])
    return read_metrics(train(cfg, plan_run(cfg, default_cache_dir())))


def run_command(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """The installed nxd-train command, as a user runs it."""
    command = [str(Path(sys.executable).with_name("nxd-train")), *args]
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=environment)
