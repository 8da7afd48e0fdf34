"""Every rank's heartbeat, so that a rank which stops answering is named and the run stops.

A rank stopped (SIGSTOP, a debugger), hung inside a library call or gone (killed, its machine lost)
leaves its peers waiting inside a collective, where torch says nothing until its own timeout, or ends
them with a raw gloo/NCCL traceback. Each rank's watch thread beats through the rendezvous store
(a client connection of its own, so a stopped store host cannot block training's) and reads the
others' beats; a peer whose beat has not moved for `distributed_strategy.collective_timeout` seconds
stops every rank that still runs, with one message naming it, from the lowest of them. A collective
that fails because a peer died is explained the same way (`explain`).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

BEAT, DONE = "beat/", "done/"
EXIT_CODE = 1
TIMEOUT_KEY = "distributed_strategy.collective_timeout"

_current: PeerWatch | None = None


class PeerWatch:
    """The watch of rank `rank` of `world_size` over the others (start it after the process group)."""

    def __init__(self, rank: int, world_size: int, timeout: float, store: Callable[[timedelta], dist.Store]):
        """`store(timeout)` connects to the run's store (a connection of the watch's own)."""
        self.rank, self.world_size, self.timeout = rank, world_size, float(timeout)
        self.interval = max(0.25, min(10.0, self.timeout / 10))
        self.others = [peer for peer in range(world_size) if peer != rank]
        self.pids: dict[int, tuple[int, str]] = {}
        """The pid and host of each peer that has beaten."""
        now = time.monotonic()
        self.moved = {peer: (None, now) for peer in self.others}
        """Each peer's last beat seen and when (by this process's clock) it last changed."""
        self._stop = threading.Event()
        self._store = store(timedelta(seconds=self.interval * 2))
        self._thread = threading.Thread(target=self._run, name="nxd-peer-watch", daemon=True)
        self._beats = 0
        self.stacks_file: Path | None = None
        """This rank's log, where its Python stacks go when the run stops for a silent or lost peer."""
        self.stacks_pattern = ""
        """The logs of every rank, as the stop message names them."""

    def start(self) -> PeerWatch:
        global _current
        _current = self
        self._beat()
        self._thread.start()
        return self

    def finish(self) -> None:
        """This rank is done: its silence from now on is not a failure."""
        global _current
        self._stop.set()
        self._say_done()
        if _current is self:
            _current = None

    def _say_done(self) -> None:
        with contextlib.suppress(RuntimeError, dist.DistError):
            self._store.set(f"{DONE}{self.rank}", "1")

    def _beat(self) -> None:
        self._beats += 1
        self._store.set(f"{BEAT}{self.rank}", f"{self._beats} {os.getpid()} {socket.gethostname()}")

    def _look(self) -> list[int]:
        """Beat and read the others' beats; the peers silent for the timeout (not those that finished)."""
        self._beat()
        now = time.monotonic()
        for peer in self.others:
            if self._store.check([f"{DONE}{peer}"]):
                self.moved[peer] = ("done", now)
                continue
            if not self._store.check([f"{BEAT}{peer}"]):
                continue
            beat = self._store.get(f"{BEAT}{peer}").decode()
            count, pid, host = beat.split(" ", 2)
            self.pids[peer] = (int(pid), host)
            if beat != self.moved[peer][0]:
                self.moved[peer] = (beat, now)
        return [peer for peer, (beat, since) in self.moved.items() if beat != "done" and now - since > self.timeout]

    def _run(self) -> None:
        unreachable = None
        while not self._stop.wait(self.interval):
            try:
                silent = self._look()
                unreachable = None
            except (RuntimeError, dist.DistError, ValueError):
                if self._stop.is_set():
                    return
                unreachable = unreachable or time.monotonic()
                if time.monotonic() - unreachable > self.timeout:  # the store's host, rank 0's process
                    self._stop_run([0], "holds the rendezvous store and ")
                continue
            if silent:
                self._stop_run(silent)

    def _describe(self, peers: list[int], how: str) -> str:
        named = ", ".join(
            f"rank {peer}" + (f" (pid {self.pids[peer][0]} on host {self.pids[peer][1]})" if peer in self.pids else "")
            for peer in peers
        )
        return f"nxd-train: {named} {how}; every rank stops (the others were waiting for it in a collective)"

    def _stop_run(self, peers: list[int], holds: str = "") -> None:
        """Say which peers are silent (from the lowest rank still running), end those on this host (a
        stopped process cannot end itself) and leave."""
        message = self._describe(
            peers, f"{holds}has not answered for {self.timeout:.0f} s ({TIMEOUT_KEY}): stopped, hung or gone"
        )
        self._leave(peers, message)

    def _leave(self, peers: list[int], message: str) -> None:
        self._say_done()  # this rank's silence from now on is its leaving, not another failure
        if self._write_stacks(message) and self.stacks_pattern:
            message += f"; each rank's Python stacks at that moment are in {self.stacks_pattern}"
        if self.rank == min(set(range(self.world_size)) - set(peers)):
            print(message, file=sys.stderr, flush=True)
        host = socket.gethostname()
        for peer in peers:
            pid, their_host = self.pids.get(peer, (None, None))
            if pid is not None and their_host == host and _alive(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        sys.stderr.flush()
        os._exit(EXIT_CODE)

    def _write_stacks(self, message: str) -> bool:
        """Append every thread's Python stack (faulthandler's, safe while the main thread is stuck in a
        collective) to this rank's log, below `message`; whether it was written."""
        if self.stacks_file is None:
            return False
        try:
            with open(self.stacks_file, "a") as log:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                log.write(f"{stamp} {message}\n{stamp} rank {self.rank}'s Python stacks (most recent call first):\n")
                log.flush()
                faulthandler.dump_traceback(log, all_threads=True)
        except OSError:
            return False
        return True

    def explain(self, error: BaseException) -> None:
        """A collective failed (`error`): name the peers that are gone (ended on this host, or not beating for
        two and a half beats) and leave; a failure no peer explains returns for the caller to report."""
        unreachable = False
        try:  # the peers' pids and beats as of the failure (a peer ended on this host is named at once)
            self._look()
        except (RuntimeError, dist.DistError, ValueError):
            unreachable = True
        seen = {peer: self.moved[peer][0] for peer in self.others}
        deadline = time.monotonic() + 2.5 * self.interval
        while not unreachable and time.monotonic() < deadline and not self._ended_here():
            time.sleep(self.interval / 2)
            try:
                self._look()
            except (RuntimeError, dist.DistError, ValueError):
                unreachable = True
        gone = self._ended_here() or [
            peer for peer in self.others if self.moved[peer][0] == seen[peer] and seen[peer] != "done"
        ]
        if unreachable and not gone and self.rank != 0:
            gone = [0]  # the store's host
        if gone:
            self._stop.set()
            first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
            self._leave(gone, self._describe(gone, f"is gone ({first})"))

    def _ended_here(self) -> list[int]:
        host = socket.gethostname()
        return [peer for peer, (pid, their_host) in self.pids.items() if their_host == host and not _alive(pid)]


FAILURE_SIGNS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Timed out waiting",
    "NCCL error",
    "Socket Timeout",
)
"""What gloo's and NCCL's errors say when a peer is gone or a collective waited too long."""


def collective_failure(error: BaseException) -> bool:
    """Whether `error` is a collective that failed for want of a peer (not a bug of the step itself)."""
    return isinstance(error, dist.DistError) or any(sign in str(error) for sign in FAILURE_SIGNS)


def current() -> PeerWatch | None:
    """This process's running watch, if any."""
    return _current


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (ended, not yet reaped by its parent) is gone
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return True
