"""The completion marker: the last file of a checkpoint, written once every rank has finished.

A checkpoint directory counts only when it holds `nxd-checkpoint.json`. The marker records the step,
the data position, the logged values, whatever the caller adds (versions, layout, the Hugging Face
mapping) and the size and digest (XXH3-64) of every file (taken as the files were written, see `checksums`), so a shard
truncated or altered after the save (a full disk, a bad copy, a flipped bit) is found before any
byte of it is loaded. The marker carries a digest of its own content too.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checksums import bytes_digest, file_digest, gather_digests
from .errors import CheckpointError

MARKER = "nxd-checkpoint.json"
FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)
UNREADABLE = "unreadable marker"
"""The `extra` entry of a checkpoint listed as incomplete because its marker cannot be read: why."""
"""Format 1 markers (sizes, no checksums) still load."""


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
    checksums: dict[str, str] = field(default_factory=dict)
    """Relative path -> "xxh3_64:..." of the bytes written (empty for format 1 markers)."""

    @property
    def size(self) -> int:
        """Bytes on disk now."""
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())

    def damage(self, *, contents: bool = False) -> str | None:
        """Why the files on disk differ from the marker's record (sizes; with `contents` also every
        file's digest, which reads the whole checkpoint), or None when they match."""
        for name, expected in self.files.items():
            file = self.path / name
            if not file.is_file():
                return f"{file} is missing (the completion marker lists it, {expected} bytes)"
            if (found := file.stat().st_size) != expected:
                return f"{file} is {found} bytes; the completion marker recorded {expected} (truncated or altered)"
        if contents:
            for name, expected in self.checksums.items():
                try:
                    found = file_digest(self.path / name)
                except OSError as error:
                    return f"{self.path / name} cannot be read ({error.strerror or error})"
                if found != expected:
                    return f"{self.path / name} has {found}; the completion marker recorded {expected} (altered)"
        return None

    def verified(self, *, contents: bool = False) -> CheckpointInfo:
        """This info, or a CheckpointError when the checkpoint is incomplete or damaged (`contents`:
        checksums too)."""
        if not self.complete:
            raise CheckpointError(
                self.extra.get(UNREADABLE)
                or f"{self.path}: no completion marker ({MARKER}): the "
                "save did not finish, so the checkpoint may be half written"
            )
        if problem := self.damage(contents=contents):
            raise CheckpointError(f"{self.path}: damaged checkpoint: {problem}")
        return self


def write_marker(
    path: Path,
    *,
    step: int,
    consumed_samples: int,
    metrics: dict[str, float],
    extra: dict[str, Any],
    digests: dict[str, str] | None = None,
) -> CheckpointInfo:
    """Record the finished checkpoint in `path` (atomically: a temporary name, then a rename), with the
    digests the writers took (`digests`, plus the ranks' sidecar files); files without one are read."""
    checksums = gather_digests(path, digests or {})
    files = {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}
    record = {
        "format": FORMAT_VERSION,
        "step": step,
        "consumed_samples": consumed_samples,
        "metrics": metrics,
        "files": files,
        "checksums": {name: checksums[name] for name in files},
        **extra,
    }
    record["marker_digest"] = _digest(record)
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
        record = json.loads(marker.read_bytes())
        if record.get("format") not in READABLE_FORMATS:
            raise ValueError("another format version")
        if "marker_digest" in record and record.pop("marker_digest") != _digest(record):
            raise ValueError("its content differs from what was written (altered)")
        record.pop("format")
        return CheckpointInfo(
            path,
            True,
            record.pop("step"),
            record.pop("consumed_samples"),
            record.pop("metrics"),
            record.pop("files"),
            record,
            record.pop("checksums", {}),
        )
    except (ValueError, KeyError, AttributeError, TypeError, OSError) as error:
        raise CheckpointError(
            f"{marker}: expected an nxd completion marker (format {FORMAT_VERSION}), found unreadable content ({error})"
        ) from None


def _digest(record: dict[str, Any]) -> str:
    """The digest of a marker's content (without its own digest), in a canonical JSON form."""
    return bytes_digest(json.dumps(record, sort_keys=True).encode())
