"""exp_manager.s3_checkpoints (GPT-NeoX's s3_path, s3_chunk_size) in real runs against a local S3-compatible
server: every complete checkpoint appears in the bucket, byte for byte; a server stopped mid-run leaves the run
to finish, naming the checkpoints that were not uploaded, and exit 1."""

from __future__ import annotations

import hashlib
import threading
import time

from nxd_train.cli import default_config_path, main

from tests.ckpt.test_s3_upload import BUCKET, s3_server  # noqa: F401 - the fixture
from tests.train.test_checkpointing import SAVE, checkpoints
from tests.training_runs import FAST, SLOWED, read_metrics

JOB = [
    "trainer.max_steps=4",
    *SAVE,
    "+exp_manager.checkpoint_callback_params.every_n_train_steps=2",
    f"+exp_manager.s3_checkpoints.path=s3://{BUCKET}/runs",
]


def _log(log_dir) -> str:
    return (log_dir / "nxd_log_globalrank-0_localrank-0.txt").read_text()


def test_each_checkpoint_appears_in_the_bucket_byte_for_byte(tmp_path, train_here, s3_server):  # noqa: F811
    _, client = s3_server
    train_here(*JOB)
    log_dir = tmp_path / "run0"
    saved = checkpoints(log_dir)
    assert sorted(saved) == [2, 4]
    for path in saved.values():
        local = {file.relative_to(path).as_posix(): file.read_bytes() for file in path.rglob("*") if file.is_file()}
        listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"runs/run0/{path.name}/")["Contents"]
        remote = {item["Key"].removeprefix(f"runs/run0/{path.name}/"): item["Key"] for item in listed}
        assert sorted(remote) == sorted(local)
        for name, data in local.items():
            body = client.get_object(Bucket=BUCKET, Key=remote[name])["Body"].read()
            assert hashlib.sha256(body).digest() == hashlib.sha256(data).digest(), name
        assert f"s3: checkpoint {path.name} uploaded to s3://{BUCKET}/runs/run0/{path.name}/" in _log(log_dir)
    assert "not uploaded" not in _log(log_dir)


def test_a_server_stopped_mid_run_leaves_the_run_to_finish_names_what_was_not_uploaded_and_exits_1(
    tmp_path,
    s3_server,  # noqa: F811
    capsys,
):
    server, client = s3_server
    stopped = threading.Event()

    def stop_at_the_first_object() -> None:
        while not stopped.is_set():
            if client.list_objects_v2(Bucket=BUCKET).get("KeyCount", 0):
                server.stop()
                stopped.set()
            time.sleep(0.02)

    watcher = threading.Thread(target=stop_at_the_first_object, daemon=True)
    watcher.start()
    log_dir = tmp_path / "run0"
    code = main([str(default_config_path()), *FAST, f"+exp_manager.explicit_log_dir={log_dir}", *JOB, *SLOWED])
    stopped.set()
    watcher.join()
    assert code == 1
    assert [row["step"] for row in read_metrics(log_dir) if "loss" in row] == [1, 2, 3, 4]  # training went on
    last = checkpoints(log_dir)[4].name
    text = _log(log_dir)
    assert f"s3: checkpoint {last} was not uploaded to s3://{BUCKET}/runs: " in text
    summary = next(line for line in text.splitlines() if "checkpoint(s) not uploaded to" in line)
    assert last in summary and f"they are only in {log_dir / 'checkpoints'}" in summary
    err = capsys.readouterr().err
    assert "training ended, but " in err and f"checkpoint(s) not uploaded to s3://{BUCKET}/runs (named above)" in err


def test_without_boto3_or_checkpoints_the_run_is_refused_before_launch(tmp_path, monkeypatch):
    import importlib.util

    import pytest
    from nxd_config import load_config
    from nxd_train.checks.preflight import PreflightError, plan_run
    from nxd_train.cli import default_config_path
    from nxd_train.run.corpus import default_cache_dir

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "boto3" else real(name, *rest))
    cfg = load_config(
        default_config_path(),
        [f"+exp_manager.explicit_log_dir={tmp_path}", f"+exp_manager.s3_checkpoints.path=s3://{BUCKET}"],
    )
    with pytest.raises(PreflightError) as caught:
        plan_run(cfg, default_cache_dir())
    assert (
        "exp_manager.s3_checkpoints.path: expected the boto3 package, found it not installed; install "
        "nxd-train[s3] (pip install boto3)"
    ) in caught.value.problems
    assert any("expected checkpoints to upload" in problem for problem in caught.value.problems)
