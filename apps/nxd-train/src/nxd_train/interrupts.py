"""SIGTERM and SIGINT during training: stop after the current step on every rank, checkpoint, and say
where to resume.

A scheduler's preemption (SIGTERM) or Ctrl-C (SIGINT) may reach one rank or all of them; the ranks
agree after each step (a max over the world), so all stop after the same step and a checkpoint
saved then is whole. A second signal exits at once, as a user pressing Ctrl-C twice expects; what is
lost then is what SIGKILL loses (training since the last complete checkpoint).
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

import torch
import torch.distributed as dist

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainingInterrupted(Exception):
    """The run stopped on a signal after a whole step; `exit_code` is the shell's 128 + signal."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class StopRequests:
    """Signal handlers for the length of a `with` block: the first signal is remembered, the second
    ends the process."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequests:
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            print(f"nxd-train: {signal.Signals(signum).name} again: exiting at once; a resume starts from the "
                  "last complete checkpoint", file=sys.stderr, flush=True)  # fmt: skip
            os._exit(128 + signum)
        self.signum = signum

    def agreed(self, device: torch.device) -> int | None:
        """The signal any rank received (the same answer on every rank), or None."""
        if not (dist.is_available() and dist.is_initialized()):
            return self.signum
        flag = torch.tensor([self.signum or 0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item()) or None
