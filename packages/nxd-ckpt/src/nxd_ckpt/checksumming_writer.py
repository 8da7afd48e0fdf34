"""DCP's file writer that takes each file's digest (`checksums`) from the bytes as it writes them."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

import xxhash
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.futures import Future

from .checksums import SIDECAR_PREFIX, digest_text


class _HashingStream(io.RawIOBase):
    """A write stream that forwards every byte to `inner` and keeps their running digest."""

    def __init__(self, inner: Any, on_close: Any):
        super().__init__()
        self.inner, self.on_close, self.digest = inner, on_close, xxhash.xxh3_64()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.digest.update(data)
        return self.inner.write(data)

    def tell(self) -> int:
        return self.inner.tell()

    def flush(self) -> None:
        self.inner.flush()

    def fileno(self) -> int:
        return self.inner.fileno()

    def close(self) -> None:
        if not self.closed:
            self.on_close(digest_text(self.digest))
        super().close()


class _HashingFileSystem(FileSystem):
    """DCP's local file system, recording the digest of each file it writes (name -> digest)."""

    def __init__(self) -> None:
        super().__init__()
        self.digests: dict[str, str] = {}

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        with super().create_stream(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            name = Path(path).name
            hashing = _HashingStream(stream, lambda digest: self.digests.__setitem__(name, digest))
            try:
                yield hashing
            finally:
                hashing.close()


class ChecksummingWriter(FileSystemWriter):
    """DCP's file writer whose files' digests are recorded as they are written: this rank's in a sidecar
    file written before its part of the save completes, the coordinator's metadata file in `digests`."""

    def __init__(self, path: Path, rank: int, **options: Any):
        super().__init__(path, **options)
        self.fs = _HashingFileSystem()
        self.sidecar = Path(path) / f"{SIDECAR_PREFIX}{rank}.json"

    @property
    def digests(self) -> dict[str, str]:
        return self.fs.digests

    def write_data(self, plan: Any, planner: Any) -> Future:
        results = super().write_data(plan, planner).wait()
        self.sidecar.write_text(json.dumps(self.fs.digests))
        done: Future = Future()
        done.set_result(results)
        return done
