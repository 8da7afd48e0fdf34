"""A job's life on a cluster, with real processes on gloo: torchrun restarting a group after a worker's
death, and a checkpoint resumed on another number of processes. Each ends with the losses of a run
never interrupted (fp32; the same arithmetic gives the same values, another split of the batch agrees
within 1e-6).

The uninterrupted reference is DP2 launched by nxd-train itself; the restarted runs are launched by
torchrun, which must not change a value.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nxd_ckpt import list_checkpoints
from nxd_train.cli import main

from tests.training_runs import CLUSTER_JOB, CLUSTER_STEPS, FAST, SLOWED, step_losses, train_in_process

JOB, SLOW, STEPS = CLUSTER_JOB, SLOWED, CLUSTER_STEPS
BIN = Path(sys.executable).parent


def nxd_train(log_dir: Path, *overrides: str) -> list[str]:
    return [str(BIN / "nxd-train"), *JOB, *overrides, f"+exp_manager.explicit_log_dir={log_dir}"]


def torchrun(log_dir: Path, *options: str, overrides: tuple[str, ...] = ("trainer.devices=2",)) -> list[str]:
    return [
        str(BIN / "torchrun"),
        *options,
        "-m",
        "nxd_train",
        *JOB,
        *overrides,
        f"+exp_manager.explicit_log_dir={log_dir}",
    ]


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def checkpoint(log_dir: Path, step: int) -> Path:
    (found,) = [i.path for i in list_checkpoints(log_dir / "checkpoints") if i.step == step and i.complete]
    return found


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    log_dir = tmp_path_factory.mktemp("whole") / "run"
    run(nxd_train(log_dir, "trainer.devices=2"), log_dir.parent)
    return log_dir


def _workers(agent: int) -> dict[int, int]:
    """torchrun's workers: rank -> pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().split(") ", 1)[1].split()[1]) != agent:
                continue
            environ = dict(item.split("=", 1) for item in (entry / "environ").read_text().split("\0") if "=" in item)
        except (OSError, IndexError, ValueError):
            continue
        if "RANK" in environ:
            found[int(environ["RANK"])] = int(entry.name)
    return found


def _wait(condition, what: str, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the run ended before {what}: {process.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.02)


def _logged_steps(log: Path) -> list[tuple[float, str]]:
    """(time, line) of rank 0's log lines, read as they are."""
    return [(os.path.getmtime(log), line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize("when", ["mid_step", pytest.param("mid_save", marks=pytest.mark.slow)])
def test_torchrun_restarts_a_dead_worker_and_the_group_resumes_exactly(tmp_path, uninterrupted, when):
    """SIGKILL of rank 1 mid-step (or while a checkpoint is being written): torchrun restarts the group, every
    new worker continues from the newest complete checkpoint by itself (no resume key), and the losses are
    the uninterrupted run's."""
    log_dir = tmp_path / "run"
    agent = subprocess.Popen(
        torchrun(log_dir, "--nproc-per-node", "2", "--max-restarts", "1", overrides=(*SLOW, "trainer.devices=2")),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        if when == "mid_step":
            _wait(
                lambda: (log_dir / "metrics.csv").exists() and max(step_losses(log_dir), default=0) >= 6,
                "step 6",
                agent,
            )
        else:
            _wait(
                lambda: any(
                    p.name.endswith(".partial") and "step=8" in p.name for p in (log_dir / "checkpoints").glob("*")
                ),
                "the step-8 save",
                agent,
            )
        killed_at = time.monotonic()
        os.kill(_workers(agent.pid)[1], signal.SIGKILL)
        rank_0_log = log_dir / "nxd_log_globalrank-0_localrank-0.txt"
        restarted = re.compile(r"torchrun restart 1 of job \S+: resumed at step (\d+)")
        _wait(lambda: restarted.search(rank_0_log.read_text()), "the restart's line", agent)
        resumed_at = int(restarted.search(rank_0_log.read_text()).group(1))
        _wait(
            lambda: re.search(
                rf"restart 1 of job[^\n]*\n(.*\n)*.*step {resumed_at + 1}/{STEPS}", rank_0_log.read_text()
            ),
            "a step after the restart",
            agent,
        )
        recovered = time.monotonic() - killed_at
        code = agent.wait(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(agent.pid, signal.SIGKILL)
    stderr = agent.stderr.read()
    assert code == 0, stderr[-3000:]
    assert resumed_at in ((4,) if when == "mid_step" else (4, 8)), resumed_at
    print(f"\nrank 1 killed {when}: the next step trained {recovered:.1f} s later, resumed at step {resumed_at}")
    expected, resumed = step_losses(uninterrupted), step_losses(log_dir)
    assert [resumed[step] for step in range(1, STEPS + 1)] == [expected[step] for step in range(1, STEPS + 1)]
    assert "Traceback" not in stderr.replace("torch.distributed.elastic", ""), stderr[-3000:]


def test_a_launch_that_disagrees_with_the_config_is_refused_before_anything_is_written(tmp_path):
    """torchrun starts 2 processes; the config says 1 per node: no run starts in the log directory."""
    log_dir = tmp_path / "run"
    result = subprocess.run(
        [
            str(BIN / "torchrun"),
            "--nproc-per-node",
            "2",
            "-m",
            "nxd_train",
            *JOB,
            f"+exp_manager.explicit_log_dir={log_dir}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    said = "trainer.devices: 1 process(es) per node, but torchrun started 2 on this node"
    assert result.stderr.count(said) == 1, result.stderr[-3000:]
    assert "expected trainer.devices: 2" in result.stderr and not log_dir.exists()


def _resumed(log_dir: Path, start: Path, devices: int, *layout: str) -> dict[int, float]:
    resume = f"+exp_manager.resume_from_checkpoint={start}"
    if devices == 1:  # one process: the same code in this one
        train_in_process(log_dir, *JOB[len(FAST) :], *layout, resume)
    else:
        run(nxd_train(log_dir, f"trainer.devices={devices}", *layout, resume), log_dir.parent)
    return step_losses(log_dir)


def _close(found: dict[int, float], expected: dict[int, float], steps: range) -> list[str]:
    return [f"step {s}: {found[s]!r} against {expected[s]!r}" for s in steps if abs(found[s] - expected[s]) > 1e-6]


def test_a_checkpoint_resumes_on_another_number_of_processes(tmp_path, uninterrupted):
    """DP2 -> DP4 -> DP1 (gradient accumulation 2 -> 1 -> 4 for the same global batch of 8): the next sample is
    the uninterrupted run's, and so is every loss."""
    expected = step_losses(uninterrupted)
    dp4 = _resumed(tmp_path / "dp4", checkpoint(uninterrupted, 4), 4)
    dp1 = _resumed(tmp_path / "dp1", checkpoint(tmp_path / "dp4", 8), 1)
    table = [
        f"step {s:2d}: uninterrupted {expected[s]:.7f}  "
        + (f"dp4 {dp4[s]:.7f}" if s in dp4 else " " * 16)
        + (f"  dp1 {dp1[s]:.7f}" if s in dp1 else "")
        for s in range(5, STEPS + 1)
    ]
    print("\n" + "\n".join(table))
    assert min(dp4) == 5 and min(dp1) == 9
    assert not _close(dp4, expected, range(5, 9)) + _close(dp1, expected, range(9, STEPS + 1))


@pytest.mark.slow
def test_a_tp2_dp2_checkpoint_resumes_as_dp4(tmp_path, uninterrupted):
    tp2 = tmp_path / "tp2dp2"
    run(
        nxd_train(
            tp2, "trainer.devices=4", "distributed_strategy.tensor_model_parallel_size=2", f"trainer.max_steps={STEPS}"
        ),
        tmp_path,
    )
    expected = step_losses(uninterrupted)
    assert not _close(step_losses(tp2), expected, range(1, 5))
    dp4 = _resumed(tmp_path / "dp4", checkpoint(tp2, 4), 4)
    assert not _close(dp4, expected, range(5, STEPS + 1))


def test_the_global_batch_that_no_longer_divides_is_refused_by_name(tmp_path, uninterrupted, capsys):
    """Refused by the config's rules, before any process starts (the command's code, in this process)."""
    command = nxd_train(
        tmp_path / "dp3", "trainer.devices=3", f"+exp_manager.resume_from_checkpoint={checkpoint(uninterrupted, 4)}"
    )
    assert main(command[1:]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "data.global_batch_size" in err and "data.micro_batch_size" in err, err


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_agents_one_killed_and_started_again_resume_exactly(tmp_path, uninterrupted):
    """Two torchrun agents (`--nnodes 2`, one process each, static rendezvous on the loopback) as two nodes; the
    second agent and its worker are killed mid-run and the agent is started again by hand: the first agent's
    group restarts, the two meet in a new round and the job ends with the uninterrupted losses."""
    log_dir, port = tmp_path / "run", _free_port()

    def agent(node: int) -> subprocess.Popen:
        options = [
            "--nnodes",
            "2",
            "--node-rank",
            str(node),
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
        ]
        command = torchrun(log_dir, *options, overrides=(*SLOW, "trainer.devices=1", "trainer.num_nodes=2"))
        return subprocess.Popen(
            command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
        )

    first, second = agent(0), agent(1)
    try:
        _wait(lambda: (log_dir / "metrics.csv").exists() and max(step_losses(log_dir), default=0) >= 6, "step 6", first)
        killed_at = time.monotonic()
        workers = _workers(second.pid)  # torchrun starts each worker in a session of its own: a node's end kills both
        os.killpg(second.pid, signal.SIGKILL)
        for pid in workers.values():
            os.kill(pid, signal.SIGKILL)
        second.wait()
        second = agent(1)
        rank_0_log = log_dir / "nxd_log_globalrank-0_localrank-0.txt"
        restarted = re.compile(r"torchrun restart \d+ of job \S+: resumed at step (\d+)")
        _wait(lambda: restarted.search(rank_0_log.read_text()), "the restart's line", first)
        print(
            f"\nthe second node's agent killed and started again: resumed "
            f"{time.monotonic() - killed_at:.1f} s after the kill"
        )
        assert first.wait(timeout=300) == 0, first.stderr.read()[-3000:]
        assert second.wait(timeout=60) == 0, second.stderr.read()[-3000:]
    finally:
        for process in (first, second):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    # two nodes of one process reduce in another order than one node of two: equal within 1e-6, not bit for bit
    assert not _close(step_losses(log_dir), step_losses(uninterrupted), range(1, STEPS + 1))
