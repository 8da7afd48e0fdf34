"""The run's log directory: exp_manager.explicit_log_dir as is, else <exp_dir>/<name>/version_N."""

from __future__ import annotations

import re
from pathlib import Path

from nxd_config.schema.exp_manager import ExpManagerConfig

DEFAULT_EXP_DIR = "nxd_logs"


def next_log_dir(exp: ExpManagerConfig, run_name: str) -> Path:
    """A new directory for this run (created); versions count up so earlier runs are never overwritten."""
    if exp.explicit_log_dir:
        path = Path(exp.explicit_log_dir)
    else:
        base = Path(exp.exp_dir or DEFAULT_EXP_DIR) / (exp.name or run_name)
        versions = [int(m.group(1)) for p in base.glob("version_*") if (m := re.fullmatch(r"version_(\d+)", p.name))]
        path = base / f"version_{max(versions, default=-1) + 1}"
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()
