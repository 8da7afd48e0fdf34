"""The Trainer-style folders a run writes beside its checkpoints (exp_manager.trainer_checkpoints): after
each save `checkpoint-<step>/` with the log history so far, retention applied to them as to the checkpoints,
and the final adapter or model in the log directory when training ends. Rank 0 only."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from nxd_ckpt import CheckpointInfo, prune_trainer_checkpoints, write_final, write_trainer_checkpoint

TRAINER_NAMES = {"loss": "loss", "lr": "learning_rate", "grad_norm": "grad_norm", "epoch": "epoch",
                 "val_loss": "eval_loss", "consumed_samples": "num_input_samples_seen"}  # fmt: skip
"""nxd's logged values -> the Trainer's log_history names (others are left out)."""


class TrainerOutputs:
    def __init__(self, log_dir: Path, state: dict[str, Any]):
        self.log_dir, self.state = log_dir, state
        self.newest: Path | None = None

    def saved(self, info: CheckpointInfo) -> None:
        """After a complete save: its Trainer-style folder, and the folders of pruned checkpoints removed."""
        write_trainer_checkpoint(info.path, self.log_dir, self.history(info.step), self.state)
        prune_trainer_checkpoints(self.log_dir)
        self.newest = info.path

    def finish(self) -> None:
        """The newest checkpoint's adapter or model in the log directory itself."""
        if self.newest is not None and self.newest.exists():
            write_final(self.newest, self.log_dir)

    def history(self, step: int) -> list[dict[str, Any]]:
        """metrics.csv's rows through `step`, under the Trainer's names, with their step."""
        path = self.log_dir / "metrics.csv"
        if not path.is_file():
            return []
        rows = []
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                at = int(float(row["step"]))
                values = {TRAINER_NAMES[name]: float(value) for name, value in row.items()
                          if name in TRAINER_NAMES and value not in ("", None)}  # fmt: skip
                if at <= step and values:
                    rows.append(values | {"step": at})
        return rows
