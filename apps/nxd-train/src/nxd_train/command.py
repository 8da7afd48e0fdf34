"""The nxd-train command's entry point. For a training run, Ctrl-C outside the training steps (loading torch and
the config, setting up, finishing) ends the process at once with one line and exit 130: a KeyboardInterrupt raised
inside a library's import can leave it half loaded and end in an unrelated traceback. The training steps
install their own handlers (`interrupts.StopRequests`), which turn Ctrl-C into a checkpoint."""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

OUTSIDE_STEPS = (b"nxd-train: interrupted outside the training steps (setting up or finishing): exiting now; "
                 b"checkpoints already complete are kept, nothing else was saved\n")  # fmt: skip


OTHER_COMMANDS = ("config", "plan", "launch", "data", "ckpt", "-h", "--help")
"""Subcommands that keep Python's own Ctrl-C: they clean up after themselves (temporary files, staging folders)."""


def main() -> int:
    training = len(sys.argv) < 2 or sys.argv[1] not in OTHER_COMMANDS
    if training and signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when started ignoring it
        signal.signal(signal.SIGINT, _exit_at_once)
    from .cli import main as command

    return command()


def _exit_at_once(signum: int, frame: FrameType | None) -> None:
    os.write(2, OUTSIDE_STEPS)
    os._exit(128 + signum)
