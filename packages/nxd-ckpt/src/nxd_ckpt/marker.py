"""The completion marker: the last file of a checkpoint, written once every rank has finished.

A checkpoint directory counts only when it holds `nxd-checkpoint.json`. The marker records the step,
the data position, the logged values, whatever the caller adds (versions, layout, the Hugging Face
mapping) and the size of every file, so a shard truncated after the save (a full disk, a bad copy) is
found before any byte of it is loaded.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CheckpointError

MARKER = "nxd-checkpoint.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint directory says about itself (`complete` False: no marker, not to be loaded)."""

    path: Path
    complete: bool
    step: int | None = None
    consumed_samples: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    """Relative path -> size in bytes when the save completed."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Bytes on disk now."""
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())

    def damage(self) -> str | None:
        """Why the files on disk differ from the marker's record, or None when they match."""
        for name, expected in self.files.items():
            file = self.path / name
            if not file.is_file():
                return f"{file} is missing (the completion marker lists it, {expected} bytes)"
            if (found := file.stat().st_size) != expected:
                return f"{file} is {found} bytes; the completion marker recorded {expected} (truncated or altered)"
        return None

    def verified(self) -> CheckpointInfo:
        """This info, or a CheckpointError when the checkpoint is incomplete or damaged."""
        if not self.complete:
            raise CheckpointError(f"{self.path}: no completion marker ({MARKER}): the save did not finish, "
                                  "so the checkpoint may be half written")  # fmt: skip
        if problem := self.damage():
            raise CheckpointError(f"{self.path}: damaged checkpoint: {problem}")
        return self


def write_marker(path: Path, *, step: int, consumed_samples: int, metrics: dict[str, float],
                 extra: dict[str, Any]) -> CheckpointInfo:  # fmt: skip
    """Record the finished checkpoint in `path` (atomically: a temporary name, then a rename)."""
    files = {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}
    record = {"format": FORMAT_VERSION, "step": step, "consumed_samples": consumed_samples, "metrics": metrics,
              "files": files, **extra}  # fmt: skip
    handle, temporary = tempfile.mkstemp(dir=path, prefix=f".{MARKER}.")
    try:
        with os.fdopen(handle, "w") as file:
            json.dump(record, file, indent=1)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path / MARKER)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return read_info(path)


def read_info(path: Path) -> CheckpointInfo:
    """The info of the checkpoint directory `path`; a marker that is not nxd's is a CheckpointError."""
    path = Path(path)
    marker = path / MARKER
    if not marker.is_file():
        return CheckpointInfo(path, complete=False)
    try:
        record = json.loads(marker.read_text())
        if record.pop("format") != FORMAT_VERSION:
            raise ValueError("another format version")
        return CheckpointInfo(path, True, record.pop("step"), record.pop("consumed_samples"), record.pop("metrics"),
                              record.pop("files"), record)  # fmt: skip
    except (ValueError, KeyError, AttributeError, TypeError) as error:
        raise CheckpointError(f"{marker}: expected an nxd completion marker (format {FORMAT_VERSION}), "
                              f"found unreadable content ({error})") from None  # fmt: skip
