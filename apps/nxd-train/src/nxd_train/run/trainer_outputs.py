"""The Trainer-style folders a run writes beside its checkpoints (exp_manager.trainer_checkpoints): after
each save `checkpoint-<step>/` with the log history so far, retention applied to them as to the checkpoints,
and the final adapter or model in the log directory when training ends. Rank 0 only."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nxd_ckpt import CheckpointError, CheckpointInfo, prune_trainer_checkpoints, write_final, write_trainer_checkpoint

TRAINER_NAMES = {
    "loss": "loss",
    "lr": "learning_rate",
    "grad_norm": "grad_norm",
    "epoch": "epoch",
    "val_loss": "eval_loss",
    "consumed_samples": "num_input_samples_seen",
}
"""nxd's logged values -> the Trainer's log_history names (others are left out)."""


class TrainerOutputs:
    def __init__(self, log_dir: Path, state: dict[str, Any], say: Callable[[str], None]):
        """`say`: how a failure is told. It is a notice, not an error: the nxd checkpoint is whole, and rank 0
        alone writes these folders, so raising would leave the other ranks waiting."""
        self.log_dir, self.state, self.say = log_dir, state, say
        self.newest: Path | None = None
        self.written: list[Path] = []

    def saved(self, info: CheckpointInfo) -> None:
        """After a complete save: its Trainer-style folder, and this run's folders of pruned checkpoints removed."""
        self.newest = info.path
        try:
            self.written.append(write_trainer_checkpoint(info.path, self.log_dir, self.history(info.step), self.state))
            for gone in prune_trainer_checkpoints(self.written):
                self.written.remove(gone)
        except (CheckpointError, OSError) as error:
            self.say(f"exp_manager.trainer_checkpoints: no Trainer-style folder for {info.path.name}: {error}")

    def finish(self) -> None:
        """The newest checkpoint's adapter or model in the log directory itself."""
        if self.newest is None or not self.newest.exists():
            return
        try:
            write_final(self.newest, self.log_dir)
        except (CheckpointError, OSError) as error:
            self.say(f"exp_manager.trainer_checkpoints: the final adapter or model was not written: {error}")

    def history(self, step: int) -> list[dict[str, Any]]:
        """metrics.csv's rows through `step`, under the Trainer's names, with their step."""
        path = self.log_dir / "metrics.csv"
        if not path.is_file():
            return []
        rows = []
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                at = int(float(row["step"]))
                values = {
                    TRAINER_NAMES[name]: float(value)
                    for name, value in row.items()
                    if name in TRAINER_NAMES and value not in ("", None)
                }
                if at <= step and values:
                    rows.append(values | {"step": at})
        return rows
