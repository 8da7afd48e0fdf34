"""A rank that stops answering, on 2 gloo processes: stopped (SIGSTOP) it once left its peer waiting
with no word past 180 s; killed, it once ended its peer in a raw gloo traceback. Now every rank ends
within distributed_strategy.collective_timeout plus 10 s, with one line naming the rank."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.training_runs import FAST

TIMEOUT = 90  # torch applies it to start-up too: a rank of nxd-train starts in about 35 s on a busy 2-core host


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().split(") ", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _ended(pid: int) -> bool:
    """Gone, or a zombie no one has reaped (a container's first process may reap nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True


def _start(tmp_path: Path) -> subprocess.Popen:
    command = [
        str(Path(sys.executable).with_name("nxd-train")),
        *FAST,
        "trainer.devices=2",
        "trainer.max_steps=100000",
        f"+distributed_strategy.collective_timeout={TIMEOUT}",
        f"+exp_manager.explicit_log_dir={tmp_path / 'run'}",
    ]
    run = subprocess.Popen(
        command,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    metrics = tmp_path / "run" / "metrics.csv"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and (not metrics.is_file() or len(metrics.read_text().splitlines()) < 4):
        assert run.poll() is None, run.stderr.read()[-3000:]
        time.sleep(0.5)
    assert metrics.is_file(), "the run did not start training"
    return run


def _listening(pids: set[int]) -> list[str]:
    """The local addresses the processes `pids` listen on (TCP), read from `ss`."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in out.splitlines() if any(f"pid={pid}," in line for pid in pids)]


@pytest.mark.parametrize(
    ("how", "said"),
    [
        pytest.param(
            signal.SIGSTOP,
            f"has not answered for {TIMEOUT} s (distributed_strategy.collective_timeout): stopped, hung or gone",
            marks=pytest.mark.slow,
        ),
        (signal.SIGKILL, "is gone ("),
    ],
    ids=["stalled", "dead"],
)
def test_a_rank_that_stops_answering_ends_every_rank_with_one_line_naming_it(how, said, tmp_path):
    run = _start(tmp_path)
    (rank_1,) = _children(run.pid)  # the launcher's process is rank 0; it starts rank 1
    if how == signal.SIGKILL:  # a run whose ranks are all on this host listens on the loopback only
        addresses = _listening({run.pid, rank_1})
        assert addresses and all(a.startswith(("127.", "[::1]")) for a in addresses), addresses
    os.kill(rank_1, how)
    stopped = time.monotonic()
    try:
        code = run.wait(timeout=TIMEOUT + 10)
        took = time.monotonic() - stopped
        rank_1_left = _ended(rank_1)
    finally:
        for pid in (run.pid, rank_1):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    stderr = run.stderr.read()
    lines = [line for line in stderr.splitlines() if "rank 1 (pid" in line]
    assert code == 1 and took < TIMEOUT + 10 and rank_1_left, (code, took, stderr[-3000:])
    assert len(lines) == 1 and f"rank 1 (pid {rank_1} on host {socket.gethostname()}) {said}" in lines[0], stderr[
        -3000:
    ]
    assert "every rank stops" in lines[0] and "Traceback" not in stderr
    logs = tmp_path / "run"
    assert f"Python stacks at that moment are in {logs}/nxd_log_globalrank-*_localrank-*.txt" in lines[0]
    rank_0 = (logs / "nxd_log_globalrank-0_localrank-0.txt").read_text()
    assert "rank 0's Python stacks (most recent call first)" in rank_0 and 'File "' in rank_0, rank_0[-2000:]


_NO_STORE = """
import sys, time
from datetime import timedelta
import torch
from nxd_parallel import LaunchWorld
from nxd_train.cluster.environment import LaunchedEnvironment, RanksDidNotMeet, RoundStrategy
world = LaunchWorld(launcher="env", world_size=2, rank=1, local_rank=1, local_world_size=2, node_rank=0, num_nodes=1,
                    master_addr="127.0.0.1", master_port=int(sys.argv[1]))
strategy = RoundStrategy(world, cluster_environment=LaunchedEnvironment(world), timeout=timedelta(seconds=2),
                         parallel_devices=[torch.device("cpu")] * 2, process_group_backend="gloo")
started = time.monotonic()
try:
    strategy._setup_distributed()
except RanksDidNotMeet as error:
    print(f"{time.monotonic() - started:.1f}")
    print(error)
"""


def test_a_rank_that_cannot_meet_the_others_at_start_up_says_so_naming_the_store_and_the_timeout():
    """Rank 1 of 2 whose rank 0 never serves the store (gone before it started, or slower than the timeout); in a
    process of its own, since a strategy's start-up sets process-wide state (Lightning's rank)."""
    with socket.socket() as probe:  # a port no one listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = subprocess.run([sys.executable, "-c", _NO_STORE, str(port)], capture_output=True, text=True, timeout=300)
    took, said = (result.stdout.splitlines() + ["", ""])[:2]
    assert result.returncode == 0 and took and float(took) < 30, result.stdout + result.stderr[-3000:]
    assert said.startswith(
        f"rank 1 of 2 did not meet the other ranks at start-up on the run's store at 127.0.0.1:{port} ("
    )
    assert said.endswith(
        "distributed_strategy.collective_timeout (2 s) to start-up too, so a rank slower to start "
        "than that (imports from a shared filesystem, a busy host) needs a longer one"
    ), said
