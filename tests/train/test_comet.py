"""Comet through the real comet-ml package without an API key: an offline experiment archived in the run
directory (no network in tests) holding the series metrics.csv and TensorBoard hold, under the configured
name, tags and other values; a resumed run goes on in the same experiment."""

from __future__ import annotations

import importlib.util
import json
import zipfile
from pathlib import Path

import pytest
from nxd_config import load_config
from nxd_train.checks.preflight import PreflightError, plan_run
from nxd_train.cli import default_config_path
from nxd_train.run.corpus import default_cache_dir

from tests.train.test_checkpointing import SAVE, checkpoints
from tests.training_runs import FAST, read_metrics, run_command, tensorboard_scalars

COMET = [
    "+exp_manager.create_comet_logger=True",
    "+exp_manager.comet_logger_kwargs.project=tiny",
    "+exp_manager.comet_logger_kwargs.name=first",
    "+exp_manager.comet_logger_kwargs.tags=[a,b]",
    "+exp_manager.comet_logger_kwargs.others={owner: tests}",
]


@pytest.fixture
def no_api_key(monkeypatch, tmp_path):
    for name in ("COMET_API_KEY", "COMET_WORKSPACE", "COMET_PROJECT_NAME", "COMET_MODE", "COMET_URL_OVERRIDE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COMET_CONFIG", str(tmp_path / "no.comet.config"))  # not the user's `comet login` file


def archived(folder: Path) -> list[tuple[dict, list[dict]]]:
    """Each offline archive's experiment.json and messages, as `comet upload` reads them."""
    found = []
    for archive in sorted(folder.rglob("*.zip"), key=lambda path: path.stat().st_mtime):
        with zipfile.ZipFile(archive) as opened:
            experiment = json.loads(opened.read("experiment.json"))
            messages = [json.loads(line) for line in opened.read("messages.json").decode().splitlines() if line]
        found.append((experiment, messages))
    return found


def series(messages: list[dict], name: str) -> dict[int, float]:
    return {
        m["payload"]["metric"]["step"]: m["payload"]["metric"]["metricValue"]
        for m in messages
        if m["type"] == "metric_msg" and m["payload"]["metric"]["metricName"] == name
    }


def others(messages: list[dict]) -> dict[str, object]:
    return {m["payload"]["key"]: m["payload"]["value"] for m in messages if m["type"] == "log_other"}


def test_an_offline_experiment_holds_the_logged_series_and_continues_on_resume(tmp_path, no_api_key):
    """Each run is the nxd-train command: comet-ml binds its log handlers to the streams of the process that imports
    it first, which inside pytest are a finished test's (transformers imports comet-ml when it is installed)."""
    log_dir = tmp_path / "run0"
    job = [
        *FAST,
        "trainer.max_steps=4",
        "exp_manager.create_tensorboard_logger=True",
        *SAVE,
        "+exp_manager.checkpoint_callback_params.every_n_train_steps=2",
        *COMET,
        f"+exp_manager.explicit_log_dir={log_dir}",
    ]
    first = run_command(*job, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    rows = read_metrics(log_dir)
    [(experiment, messages)] = archived(log_dir / "comet")
    key = (log_dir / "comet_experiment_key").read_text().strip()
    assert experiment["offline_id"] == key and experiment["project_name"] == "tiny"
    assert others(messages)["Name"] == "first" and others(messages)["owner"] == "tests"
    assert sorted(experiment["tags"]) == ["a", "b"]
    for name in ("loss", "lr", "grad_norm"):
        logged = {int(row["step"]): row[name] for row in rows if name in row}
        assert series(messages, name) == logged
        board = [value for _, value in tensorboard_scalars(log_dir / "tensorboard")[name]]
        assert board == pytest.approx(list(logged.values()), rel=1e-6)  # stored as float32
    params = {
        m["payload"]["param"]["paramName"]: m["payload"]["param"]["paramValue"]
        for m in messages
        if m["type"] == "parameter_msg" and "param" in m["payload"]
    }
    assert params["trainer|max_steps"] == 4  # the resolved config, flattened as Comet shows it
    again = run_command(*job, f"+exp_manager.resume_from_checkpoint={checkpoints(log_dir)[2]}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [row["step"] for row in read_metrics(log_dir) if "loss" in row][-2:] == [3, 4]
    [_, (continued, messages)] = archived(log_dir / "comet")
    assert continued["offline_id"] == key and set(series(messages, "loss")) == {3, 4}


def test_without_the_comet_package_the_run_is_refused_before_launch(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *rest: None if name == "comet_ml" else real(name, *rest)
    )
    cfg = load_config(
        default_config_path(), [f"+exp_manager.explicit_log_dir={tmp_path}", "+exp_manager.create_comet_logger=True"]
    )
    with pytest.raises(
        PreflightError,
        match=r"create_comet_logger: expected the comet-ml package, found it not "
        r"installed; install nxd-train\[comet\]",
    ):
        plan_run(cfg, default_cache_dir())
