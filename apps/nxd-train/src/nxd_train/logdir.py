"""The run's log directory: exp_manager.explicit_log_dir as is, else <exp_dir>/<name>/version_N."""

from __future__ import annotations

import re
from pathlib import Path

from nxd_ckpt import list_checkpoints
from nxd_config.schema.exp_manager import ExpManagerConfig

DEFAULT_EXP_DIR = "nxd_logs"
CHECKPOINT_DIR = "checkpoints"
"""Checkpoints live in <log dir>/checkpoints."""


def _versions(exp: ExpManagerConfig, run_name: str) -> tuple[Path, list[int]]:
    base = Path(exp.exp_dir or DEFAULT_EXP_DIR) / (exp.name or run_name)
    found = [int(m.group(1)) for p in base.glob("version_*") if (m := re.fullmatch(r"version_(\d+)", p.name))]
    return base, sorted(found)


def resumable_log_dir(exp: ExpManagerConfig, run_name: str) -> Path:
    """Where resume_if_exists looks: explicit_log_dir, else the newest version holding a complete checkpoint
    (the newest version when none does)."""
    if exp.explicit_log_dir:
        return Path(exp.explicit_log_dir).resolve()
    base, versions = _versions(exp, run_name)
    for version in reversed(versions):
        path = base / f"version_{version}"
        if any(info.complete for info in list_checkpoints(path / CHECKPOINT_DIR)):
            return path.resolve()
    return (base / f"version_{versions[-1] if versions else 0}").resolve()


def next_log_dir(exp: ExpManagerConfig, run_name: str) -> Path:
    """A new directory for this run (created); versions count up so earlier runs are never overwritten."""
    if exp.explicit_log_dir:
        path = Path(exp.explicit_log_dir)
    else:
        base, versions = _versions(exp, run_name)
        path = base / f"version_{max(versions, default=-1) + 1}"
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()
