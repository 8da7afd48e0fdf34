"""The run's log directory: exp_manager.explicit_log_dir as is, else <exp_dir>/<name>/version_N."""

from __future__ import annotations

import re
from pathlib import Path

from nxd_ckpt import list_checkpoints

DEFAULT_EXP_DIR = "nxd_logs"
CHECKPOINT_DIR = "checkpoints"
"""Checkpoints live in <log dir>/checkpoints."""


def _versions(exp_dir: Path | None, name: str) -> tuple[Path, list[int]]:
    base = Path(exp_dir or DEFAULT_EXP_DIR) / name
    found = [int(m.group(1)) for p in base.glob("version_*") if (m := re.fullmatch(r"version_(\d+)", p.name))]
    return base, sorted(found)


def resumable_log_dir(explicit_log_dir: Path | None, exp_dir: Path | None, name: str) -> Path:
    """Where resume_if_exists looks: explicit_log_dir, else the newest version holding a complete checkpoint
    (the newest version when none does)."""
    if explicit_log_dir:
        return Path(explicit_log_dir).resolve()
    base, versions = _versions(exp_dir, name)
    for version in reversed(versions):
        path = base / f"version_{version}"
        if any(info.complete for info in list_checkpoints(path / CHECKPOINT_DIR)):
            return path.resolve()
    return (base / f"version_{versions[-1] if versions else 0}").resolve()


def next_log_dir(explicit_log_dir: Path | None, exp_dir: Path | None, name: str) -> Path:
    """A new directory for this run (created); versions count up so earlier runs are never overwritten."""
    if explicit_log_dir:
        path = Path(explicit_log_dir)
    else:
        base, versions = _versions(exp_dir, name)
        path = base / f"version_{max(versions, default=-1) + 1}"
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()
