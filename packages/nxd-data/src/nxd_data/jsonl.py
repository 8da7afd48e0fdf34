"""The lines of a jsonl file (plain, .gz or .zst), numbered, with every way of failing named.

Lines are split as bytes and decoded one by one, so a byte that is not UTF-8 is reported on its own
line (a text stream decodes ahead in blocks and blames an earlier one). A compressed stream that
stops before its end marker is truncated, said with the bytes read; it is never taken for a bad line,
which `--skip-bad-lines` would drop in silence.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from pathlib import Path

import zstandard

from .errors import DataError

CHUNK = 1 << 20


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number from 1, text) of each line of `path`; DataError naming the file and line or offset."""
    number = 0
    pending = b""
    try:
        for block in _blocks(path):
            lines = (pending + block).split(b"\n")
            pending = lines.pop()
            for raw in lines:
                number += 1
                yield number, _decoded(path, number, raw)
        if pending:
            number += 1
            yield number, _decoded(path, number, pending)
    except OSError as error:
        raise DataError(f"{path}: cannot be read after line {number} ({error.strerror or error})") from None


def _decoded(path: Path, number: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(
            f"{path}:{number}: expected UTF-8 text, found byte 0x{raw[error.start]:02x} at column {error.start + 1}"
        ) from None


def _blocks(path: Path) -> Iterator[bytes]:
    """The decompressed bytes of `path` in blocks."""
    with path.open("rb") as handle:
        if path.suffix == ".gz":
            yield from _gzip_blocks(path, handle)
        elif path.suffix == ".zst":
            yield from _zstd_blocks(path, handle)
        else:
            while block := handle.read(CHUNK):
                yield block


def _gzip_blocks(path: Path, handle) -> Iterator[bytes]:  # noqa: ANN001 - a binary file
    reader = gzip.GzipFile(fileobj=handle)
    try:
        while block := reader.read(CHUNK):
            yield block
    except EOFError:
        raise DataError(_truncated(path, handle.tell())) from None
    except (gzip.BadGzipFile, zlib.error) as error:
        raise DataError(
            f"{path}: expected gzip data, found a damaged stream near byte {handle.tell():,} ({error})"
        ) from None


def _zstd_blocks(path: Path, handle) -> Iterator[bytes]:  # noqa: ANN001 - a binary file
    """Frame after frame; input that ends inside a frame is truncation."""
    decompressor, finished = zstandard.ZstdDecompressor().decompressobj(), True
    try:
        while compressed := handle.read(CHUNK):
            while compressed:
                finished = False
                block = decompressor.decompress(compressed)
                if block:
                    yield block
                compressed = b""
                if decompressor.eof:  # a frame ended: what follows is the next frame
                    finished, compressed = True, decompressor.unused_data
                    decompressor = zstandard.ZstdDecompressor().decompressobj()
    except zstandard.ZstdError as error:
        raise DataError(
            f"{path}: expected zstd data, found a damaged stream near byte {handle.tell():,} ({error})"
        ) from None
    if not finished:
        raise DataError(_truncated(path, handle.tell()))


def _truncated(path: Path, read: int) -> str:
    return (
        f"{path}: truncated: after reading {read:,} bytes the compressed stream has not reached its end "
        "marker (a partial download or copy?)"
    )
