"""`nxd-train ckpt list`, `nxd-train ckpt verify` and `nxd-train ckpt export-hf`."""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

from nxd_ckpt import (
    MARKER,
    CheckpointError,
    CheckpointInfo,
    CheckpointWarning,
    is_checkpoint_dir,
    list_checkpoints,
    newest_usable,
    read_info,
)

from nxd_train.commands.export_dtypes import EXPORT_DTYPES
from nxd_train.logging.log_dir import CHECKPOINT_DIR


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
            elif (info.path / MARKER).exists():
                state = f"DAMAGED: {_reason(info)}; never loaded"
            else:
                state = "INCOMPLETE: no completion marker (the save did not finish); never loaded"
            step = "?" if info.step is None else str(info.step)
            samples = "?" if info.consumed_samples is None else str(info.consumed_samples)
            rows.append((info.path.name, step, samples, _size(info.size), state))
        widths = [max(len(row[column]) for row in rows) for column in range(4)]
        for row in rows:
            print("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[4])
    return 0


def _reason(info: CheckpointInfo) -> str:
    try:
        info.verified()
    except CheckpointError as error:
        return str(error)
    return "complete"


def verify_command(path: Path) -> int:
    """Read every file of each checkpoint `path` names and compare with its marker's record."""
    if not path.is_dir():
        print(
            f"nxd-train ckpt verify: {path}: expected a checkpoint or log directory, found no directory",
            file=sys.stderr,
        )
        return 1
    if is_checkpoint_dir(path):
        try:
            infos = [read_info(path)]
        except CheckpointError as error:
            print(f"{path}: DAMAGED: {error}")
            return 1
    else:
        infos = [info for folder in checkpoint_folders(path) for info in list_checkpoints(folder)]
    if not infos:
        print(f"{path}: no checkpoints")
        return 0
    damaged = 0
    for info in infos:
        started = time.perf_counter()
        try:
            info.verified(contents=True)
        except CheckpointError as error:
            damaged += 1
            print(f"{info.path}: DAMAGED: {error}")
            continue
        seconds = time.perf_counter() - started
        if not info.checksums:
            print(f"{info.path}: ok: sizes match (saved before checksums were recorded)")
            continue
        print(
            f"{info.path}: ok: {len(info.checksums)} files, digest and sizes match; {_size(info.size)} read in "
            f"{seconds:.2f} s ({info.size / max(seconds, 1e-9) / 2**30:,.2f} GiB/s)"
        )
    return 1 if damaged else 0


def export_command(checkpoint: Path, out: Path, dtype: str | None, merged: bool = False) -> int:
    import torch
    from nxd_ckpt import export_hf  # torch.distributed.checkpoint: for the export only, not for list and verify

    try:
        if not is_checkpoint_dir(checkpoint):  # a log directory: its newest complete checkpoint
            folders = checkpoint_folders(checkpoint)
            newest, passed_over = newest_usable(folders[0]) if folders else (None, [])
            if newest is None:
                found = f"none usable: {'; '.join(passed_over)}" if passed_over else "none"
                raise CheckpointError(
                    f"{checkpoint}: expected a checkpoint or a log directory holding one, found {found}"
                )
            for reason in passed_over:
                print(f"notice: skipping a checkpoint: {reason}; using {newest.path.name}", file=sys.stderr)
            checkpoint = newest.path
        with warnings.catch_warnings(record=True) as notices:
            warnings.simplefilter("always", CheckpointWarning)
            written = export_hf(
                checkpoint, out, dtype=getattr(torch, EXPORT_DTYPES[dtype]) if dtype else None, merged=merged
            )
    except CheckpointError as error:
        print(f"nxd-train ckpt export-hf: {error}", file=sys.stderr)
        return 1
    for notice in notices:
        print(f"notice: {notice.message}", file=sys.stderr)
    files = ", ".join(sorted(path.name for path in written.iterdir()))
    print(f"exported {checkpoint} to {written} ({files})")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        return list_command(args.log_dir)
    if args.action == "verify":
        return verify_command(args.path)
    return export_command(args.checkpoint, args.out, args.dtype, args.merged)
