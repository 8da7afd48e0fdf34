"""`nxd-train ckpt list` and `nxd-train ckpt export-hf`."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
from nxd_ckpt import (
    CheckpointError,
    CheckpointWarning,
    export_hf,
    is_checkpoint_dir,
    latest_checkpoint,
    list_checkpoints,
)

from .cli import EXPORT_DTYPES
from .logdir import CHECKPOINT_DIR


def checkpoint_folders(log_dir: Path) -> list[Path]:
    """The checkpoint folders a user may mean by `log_dir`: itself, its checkpoints/, or those of its version_N runs."""
    candidates = [log_dir / CHECKPOINT_DIR, *sorted(log_dir.glob(f"version_*/{CHECKPOINT_DIR}")), log_dir]
    return [folder for folder in candidates if list_checkpoints(folder)]


def _size(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB" if size >= 2**20 else f"{size / 2**10:,.1f} KiB"


def list_command(log_dir: Path) -> int:
    if not log_dir.is_dir():
        print(f"nxd-train ckpt list: {log_dir}: expected a log directory, found no directory", file=sys.stderr)
        return 1
    folders = checkpoint_folders(log_dir)
    if not folders:
        print(f"{log_dir}: no checkpoints")
        return 0
    for folder in folders:
        last = folder / "last"
        last_target = last.resolve().name if last.is_symlink() else None
        print(f"{folder}:")
        rows = [("NAME", "STEP", "SAMPLES", "SIZE", "STATE")]
        for info in list_checkpoints(folder):
            if info.complete:
                damage = info.damage()
                state = f"DAMAGED: {damage}" if damage else "complete"
                if info.path.name == last_target:
                    state += " (last)"
            else:
                state = "INCOMPLETE: no completion marker (the save did not finish); never loaded"
            step = "?" if info.step is None else str(info.step)
            samples = "?" if info.consumed_samples is None else str(info.consumed_samples)
            rows.append((info.path.name, step, samples, _size(info.size), state))
        widths = [max(len(row[column]) for row in rows) for column in range(4)]
        for row in rows:
            print("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[4])
    return 0


def export_command(checkpoint: Path, out: Path, dtype: str | None, merged: bool = False) -> int:
    try:
        if not is_checkpoint_dir(checkpoint):  # a log directory: its newest complete checkpoint
            folders = checkpoint_folders(checkpoint)
            newest = latest_checkpoint(folders[0]) if folders else None
            if newest is None:
                raise CheckpointError(f"{checkpoint}: expected a checkpoint or a log directory holding one, found none")
            checkpoint = newest.path
        with warnings.catch_warnings(record=True) as notices:
            warnings.simplefilter("always", CheckpointWarning)
            written = export_hf(checkpoint, out, dtype=getattr(torch, EXPORT_DTYPES[dtype]) if dtype else None,
                                merged=merged)  # fmt: skip
    except CheckpointError as error:
        print(f"nxd-train ckpt export-hf: {error}", file=sys.stderr)
        return 1
    for notice in notices:
        print(f"notice: {notice.message}", file=sys.stderr)
    files = ", ".join(sorted(path.name for path in written.iterdir()))
    print(f"exported {checkpoint} to {written} ({files})")
    return 0
