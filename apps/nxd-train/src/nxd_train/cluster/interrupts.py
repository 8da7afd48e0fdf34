"""Signals during training: stop after the current step on every rank, checkpoint, and say where to
resume; under a Slurm batch job, requeue it so that it resumes by itself.

A scheduler's preemption or time-limit warning (SIGTERM, or Slurm's `--signal=USR1@SECONDS`) or Ctrl-C
(SIGINT) may reach one rank or all of them; the ranks agree after each step (a max over the world), so
all stop after the same step and a checkpoint saved then is whole. A second signal exits at once, as a
user pressing Ctrl-C twice expects (what is lost then is what SIGKILL loses: training since the last
complete checkpoint); the same signal again within `ECHO_SECONDS` is the first one delivered twice
(`uv run` forwards a signal to its child while the terminal or Slurm signals the whole group), not a second.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from types import FrameType

import torch
import torch.distributed as dist

STOP_SIGNALS = ("SIGTERM", "SIGINT")
ECHO_SECONDS = 1.0


@dataclass(frozen=True)
class Preemption:
    """What a signal during training does: trainer.requeue_signal, auto_requeue, requeue_exit_code."""

    requeue_signal: str | None = "SIGUSR1"
    auto_requeue: bool = True
    exit_code: int | None = None

    @property
    def signals(self) -> tuple[signal.Signals, ...]:
        names = dict.fromkeys((*STOP_SIGNALS, *([self.requeue_signal] if self.requeue_signal else [])))
        return tuple(signal.Signals[name] for name in names)

    def requeues(self, signum: int, slurm: bool) -> bool:
        """Whether stopping on `signum` requeues the job (`slurm`: the run is a Slurm job's)."""
        return slurm and self.auto_requeue and signal.Signals(signum).name in ("SIGTERM", self.requeue_signal)

    def code(self, signum: int) -> int:
        return 128 + signum if self.exit_code is None else self.exit_code


class TrainingInterrupted(Exception):
    """The run stopped on a signal after a whole step; `exit_code` is what the process exits with."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class StopRequests:
    """Signal handlers for the length of a `with` block: the first signal is remembered, a second one
    ends the process."""

    def __init__(
        self,
        signals: tuple[signal.Signals, ...] = tuple(signal.Signals[s] for s in STOP_SIGNALS),
        *,
        acknowledge: bool = True,
    ):
        """`acknowledge`: say on stderr that the first signal was heard (the run gives it to rank 0 only, so that a
        Ctrl-C reaching every rank is said once; a signal reaching another rank alone is said when the run stops)."""
        self.acknowledge = acknowledge
        self.signum: int | None = None
        self._signals = signals
        self._at = 0.0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequests:
        for signum in self._signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.signum is not None:
            if signum == self.signum and now - self._at < ECHO_SECONDS:
                return  # the same signal delivered twice (a forwarding parent and the process group)
            print(
                f"nxd-train: {signal.Signals(signum).name} again: exiting at once; a resume starts from the "
                "last complete checkpoint",
                file=sys.stderr,
                flush=True,
            )
            os._exit(128 + signum)
        self.signum, self._at = signum, now
        if self.acknowledge:  # os.write: print may be in use by the code this handler interrupted
            os.write(
                2,
                f"nxd-train: {signal.Signals(signum).name}: stopping after this step with a checkpoint "
                "(the same signal again, a second later or more, exits at once)\n".encode(),
            )

    def agreed(self, device: torch.device) -> int | None:
        """The signal any rank received (the same answer on every rank), or None."""
        if not (dist.is_available() and dist.is_initialized()):
            return self.signum
        flag = torch.tensor([self.signum or 0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item()) or None


def requeue(job: str) -> str:
    """Requeue Slurm job `job` (`scontrol requeue`); what happened, for the run's last line."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return f"Slurm job {job} not requeued: scontrol is not on this node's PATH"
    try:
        result = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"Slurm job {job} not requeued: scontrol requeue failed ({error})"
    if result.returncode:
        why = (result.stderr or result.stdout).strip().splitlines()[-1:] or [f"exit {result.returncode}"]
        return f"Slurm job {job} not requeued: scontrol requeue said {why[0]!r} (submitted with --no-requeue?)"
    return f"Slurm job {job} requeued: it resumes from this checkpoint when it runs again"
