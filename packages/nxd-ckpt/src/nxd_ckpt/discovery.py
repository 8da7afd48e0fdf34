"""Finding checkpoints in a directory: every one with its state, and the newest one that is usable."""

from __future__ import annotations

import warnings
from pathlib import Path

from .errors import CheckpointError, CheckpointWarning
from .marker import MARKER, UNREADABLE, CheckpointInfo, read_info

DCP_METADATA = ".metadata"


def is_checkpoint_dir(path: Path) -> bool:
    """A directory an nxd save wrote into (complete or not); `last` links are not counted twice."""
    return (
        path.is_dir()
        and not path.is_symlink()
        and ((path / MARKER).exists() or (path / DCP_METADATA).exists() or any(path.glob("*.distcp")))
    )


def list_checkpoints(root: Path) -> list[CheckpointInfo]:
    """The checkpoints directly under `root`, oldest first: complete ones by the step their marker
    records (file times change with a `touch` or a copy), then half-written ones (no marker) by name.
    A marker that cannot be read counts as half written."""
    root = Path(root)
    if not root.is_dir():
        return []
    infos = []
    for path in root.iterdir():
        if is_checkpoint_dir(path):
            try:
                infos.append(read_info(path))
            except CheckpointError as error:
                infos.append(CheckpointInfo(path, complete=False, extra={UNREADABLE: str(error)}))
    return sorted(infos, key=lambda i: (i.complete is False, i.step or 0, i.consumed_samples or 0, i.path.name))


def newest_usable(root: Path, *, contents: bool = True) -> tuple[CheckpointInfo | None, list[str]]:
    """The complete, undamaged checkpoint of the highest step under `root`, and what is wrong with each newer one
    passed over: half written (no marker) or damaged (a file missing, shorter or, with `contents`, whose digest
    differs from the marker's record), so that a caller finding none can say why."""
    infos = list_checkpoints(root)
    usable = None
    passed_over = []
    for info in [i for i in infos if not i.complete] + [i for i in reversed(infos) if i.complete]:
        try:
            usable = info.verified(contents=contents)
            break
        except CheckpointError as error:
            passed_over.append(str(error))
    return usable, passed_over


def latest_checkpoint(root: Path, *, contents: bool = True) -> CheckpointInfo | None:
    """`newest_usable`'s checkpoint, each one passed over said with a CheckpointWarning."""
    usable, passed_over = newest_usable(root, contents=contents)
    for reason in passed_over:
        fallback = f"using {usable.path.name}" if usable else "no complete checkpoint remains"
        warnings.warn(f"skipping a checkpoint: {reason}; {fallback}", CheckpointWarning, stacklevel=2)
    return usable
