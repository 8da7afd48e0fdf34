"""The nxd-train command's entry point. For a training run, Ctrl-C or SIGTERM outside the training steps (loading
torch and the config, setting up, finishing) ends the process at once with one line and exit 130 / 143: a
KeyboardInterrupt raised inside a library's import can leave it half loaded and end in an unrelated traceback, and
SIGTERM's default action would end it without a word. The training steps install their own handlers
(`interrupts.StopRequests`), which turn either signal into a checkpoint."""

from __future__ import annotations

import logging
import os
import signal
import sys
from types import FrameType

OUTSIDE_STEPS = (
    "nxd-train: {name} outside the training steps (setting up or finishing): exiting now; checkpoints "
    "already complete are kept, nothing else was saved\n"
)
SIGNALS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
"""The signals a training run handles, with the handler Python starts with (another one, SIG_IGN included, is the
parent's choice and kept)."""


def main() -> int:
    # torch logs a deprecation for each enum torchao registers, and transformers imports torchao wherever it is
    # installed (nxd-train[fp8]): not the user's to act on, so not printed at every start
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    from nxd_train.commands.table import COMMANDS  # argparse alone: nothing that Ctrl-C could interrupt half loaded

    own_ctrl_c = {command.name for command in COMMANDS if command.keeps_ctrl_c} | {"-h", "--help"}
    training = len(sys.argv) < 2 or sys.argv[1] not in own_ctrl_c
    for signum, default in SIGNALS.items() if training else ():
        if signal.getsignal(signum) is default:
            signal.signal(signum, _exit_at_once)
    from nxd_train.cli import main as command

    return command()


def _exit_at_once(signum: int, frame: FrameType | None) -> None:
    os.write(2, OUTSIDE_STEPS.format(name=signal.Signals(signum).name).encode())
    os._exit(128 + signum)
