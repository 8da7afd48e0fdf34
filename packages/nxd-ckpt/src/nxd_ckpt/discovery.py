"""Finding checkpoints in a directory: every one with its state, and the newest one that is usable."""

from __future__ import annotations

import warnings
from pathlib import Path

from .errors import CheckpointError, CheckpointWarning
from .marker import MARKER, CheckpointInfo, read_info

DCP_METADATA = ".metadata"


def is_checkpoint_dir(path: Path) -> bool:
    """A directory an nxd save wrote into (complete or not); `last` links are not counted twice."""
    return path.is_dir() and not path.is_symlink() and (
        (path / MARKER).exists() or (path / DCP_METADATA).exists() or any(path.glob("*.distcp"))
    )


def list_checkpoints(root: Path) -> list[CheckpointInfo]:
    """The checkpoints directly under `root`, oldest first (by when their folder last changed: the
    marker's writing for a complete one)."""
    root = Path(root)
    if not root.is_dir():
        return []
    infos = [read_info(path) for path in root.iterdir() if is_checkpoint_dir(path)]
    return sorted(infos, key=lambda i: (i.path.stat().st_mtime, i.path.name))


def latest_checkpoint(root: Path) -> CheckpointInfo | None:
    """The newest complete, undamaged checkpoint under `root`. Newer ones that are half written (no
    marker) or damaged (a file shorter than recorded) are passed over with a CheckpointWarning."""
    infos = list_checkpoints(root)
    usable = None
    passed_over = []
    for info in reversed(infos):
        try:
            usable = info.verified()
            break
        except CheckpointError as error:
            passed_over.append(str(error))
    for reason in passed_over:
        fallback = f"using {usable.path.name}" if usable else "no complete checkpoint remains"
        warnings.warn(f"skipping a checkpoint: {reason}; {fallback}", CheckpointWarning, stacklevel=2)
    return usable
