"""Weights & Biases through the real wandb package, offline (WANDB_MODE=offline writes the run to disk; no
network in tests): the run holds the series metrics.csv and TensorBoard hold."""

from __future__ import annotations

import importlib.util

import pytest
from nxd_config import load_config
from nxd_train.checks.preflight import PreflightError, plan_run
from nxd_train.cli import default_config_path
from nxd_train.run.corpus import default_cache_dir

from tests.training_runs import tensorboard_scalars, wandb_history


@pytest.fixture
def offline(monkeypatch, tmp_path):
    for name in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))


def test_an_offline_wandb_run_holds_the_logged_series(tmp_path, train_here, offline):
    rows = train_here(
        "trainer.max_steps=3",
        "exp_manager.create_tensorboard_logger=True",
        "+exp_manager.create_wandb_logger=True",
        "+exp_manager.wandb_logger_kwargs.project=tiny",
        "+exp_manager.wandb_logger_kwargs.group=tests",
    )
    log_dir = tmp_path / "run0"
    history = [row for row in wandb_history(log_dir) if "loss" in row]
    assert [row["_step"] for row in history] == [1, 2, 3]
    for name in ("loss", "lr", "grad_norm"):
        assert [row[name] for row in history] == [row[name] for row in rows if name in row]
        board = [value for _, value in tensorboard_scalars(log_dir / "tensorboard")[name]]
        assert board == pytest.approx([row[name] for row in rows if name in row], rel=1e-6)  # stored as float32
    assert (log_dir / "wandb_run_id").read_text().strip()


def test_without_the_wandb_package_the_run_is_refused_before_launch(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "wandb" else real(name, *rest))
    cfg = load_config(
        default_config_path(), [f"+exp_manager.explicit_log_dir={tmp_path}", "+exp_manager.create_wandb_logger=True"]
    )
    with pytest.raises(
        PreflightError, match=r"create_wandb_logger: expected the wandb package, found it not installed"
    ):
        plan_run(cfg, default_cache_dir())
