"""Megatron's memory-mapped indexed dataset: a `.bin` file of tokens and an `.idx` file describing it.

The layout (Megatron-LM `MMapIndexedDataset`, GPT-NeoX, Megatron-core `IndexedDataset`), all
little-endian:

    .idx  magic b"MMIDIDX\\x00\\x00" | version u64 = 1 | dtype code u8 | sequence count u64 |
          document-index count u64 | sequence lengths int32[n] | byte pointers int64[n] |
          document indices int64[d] (0, ..., n: sequence boundaries of documents)
    .bin  the tokens of every sequence, back to back, in the dtype of the code

The older format (`data_impl: cached`, magic TNTIDX) is read too: `legacy_index` turns its index into
these arrays.

Files are written under temporary names and renamed when complete, so a crashed writer never leaves
a half-written dataset under the real name.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import socket
import struct
from pathlib import Path
from types import TracebackType

import numpy as np

from .errors import DataError
from .files import new_temporary
from .legacy_index import LEGACY_MAGIC, read_legacy_index

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPE_CODES: dict[int, type[np.generic]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
CODE_OF = {np.dtype(dtype): code for code, dtype in DTYPE_CODES.items()}
FLOAT_CODES = (6, 7)
_HEADER = struct.Struct("<9sQBQQ")
WARMUP_CHUNK = 100 * 1024 * 1024


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest dtype Megatron stores token ids in: uint16 when every id fits, int32 otherwise."""
    return np.dtype(np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32)


def data_files(prefix: str | os.PathLike) -> tuple[Path, Path]:
    """The `.idx` and `.bin` paths of a dataset prefix."""
    return Path(f"{os.fspath(prefix)}.idx"), Path(f"{os.fspath(prefix)}.bin")


class IndexedDataset:
    """A read-only view of a `.bin/.idx` pair; sequences come from a memory map (nothing is loaded).

    Every inconsistency — missing files, a foreign magic, another version, an unknown dtype code, an
    index shorter than its header promises, a token file of another length than its index describes — is
    a DataError naming the file.
    """

    def __init__(self, prefix: str | os.PathLike, *, warmup: bool = False, impl: str = "infer"):
        """`impl` (data.data_impl): mmap or cached insists on that format, infer reads either."""
        self.prefix = os.fspath(prefix)
        self.index_path, self.bin_path = data_files(prefix)
        missing = [str(path) for path in (self.index_path, self.bin_path) if not path.is_file()]
        if missing:
            raise DataError(
                f"data prefix {self.prefix}: expected {self.index_path.name} and {self.bin_path.name}, "
                f"missing {', '.join(missing)}"
            )
        if (size := self.index_path.stat().st_size) < _HEADER.size:  # an empty file cannot be memory-mapped
            raise DataError(
                f"{self.index_path}: expected an index header of {_HEADER.size} bytes, found a {size}-byte file"
            )
        with self.index_path.open("rb") as file:
            magic = file.read(len(MAGIC))
        legacy = magic.startswith(LEGACY_MAGIC)
        if impl == "mmap" and legacy:
            raise DataError(
                f"{self.index_path}: data_impl mmap expected a Megatron mmap index, found the older "
                "cached format (magic TNTIDX); set data_impl: cached or infer"
            )
        if impl == "cached" and not legacy:
            raise DataError(
                f"{self.index_path}: data_impl cached expected the older indexed format (magic "
                f"{LEGACY_MAGIC!r}), found {magic!r}; set data_impl: mmap or infer"
            )
        if legacy:
            index = read_legacy_index(self.index_path)
            self.dtype, self.sizes, self.pointers = index.dtype, index.sizes, index.pointers
            self.document_indices = index.document_indices
        else:
            self._read_mmap_index()
        count, documents = len(self.sizes), len(self.document_indices)
        if documents and (self.document_indices[0] != 0 or self.document_indices[-1] != count):
            raise DataError(
                f"{self.index_path}: expected document indices from 0 to {count}, found "
                f"{self.document_indices[0]} to {self.document_indices[-1]}"
            )
        if documents and (falls := np.flatnonzero(np.diff(self.document_indices) < 0)).size:
            at, values = int(falls[0]) + 1, self.document_indices
            raise DataError(
                f"{self.index_path}: document index {at} is {values[at]}, below the one before it "
                f"({values[at - 1]}); expected them not to decrease (the index is damaged)"
            )
        if count and (bad := _inconsistent(self.sizes, self.pointers, self.dtype.itemsize)) is not None:
            raise DataError(
                f"{self.index_path}: sequence {bad}: its length {int(self.sizes[bad])} and byte offset "
                f"{int(self.pointers[bad])} disagree with the sequences before it (lengths must be >= 0 "
                f"and each sequence must start where the previous one ends in {self.bin_path.name}); "
                "the index is damaged"
            )
        needed = int(self.pointers[-1]) + int(self.sizes[-1]) * self.dtype.itemsize if count else 0
        found = self.bin_path.stat().st_size
        if found != needed:  # Megatron's writer lays the sequences back to back, nothing after the last
            why = "truncated?" if found < needed else "an index written for another token file?"
            raise DataError(
                f"{self.bin_path}: expected exactly the {needed} bytes of tokens {self.index_path} "
                f"describes ({count} sequences), found {found} ({why})"
            )
        self.tokens = np.memmap(self.bin_path, dtype=self.dtype, mode="r") if found else np.empty(0, self.dtype)
        if warmup:  # page both files in now rather than during the first steps (`data.skip_warmup: False`)
            for path in (self.index_path, self.bin_path):
                with path.open("rb") as file:
                    while file.read(WARMUP_CHUNK):
                        pass

    def _read_mmap_index(self) -> None:
        index = np.memmap(self.index_path, dtype=np.uint8, mode="r")
        magic, version, code, count, documents = _HEADER.unpack(index[: _HEADER.size].tobytes())
        if magic != MAGIC:
            raise DataError(
                f"{self.index_path}: expected the magic {MAGIC!r} of a Megatron mmap index, found {magic!r}"
            )
        if version != VERSION:
            raise DataError(f"{self.index_path}: expected index version {VERSION}, found {version}")
        if code not in DTYPE_CODES:
            raise DataError(f"{self.index_path}: expected a dtype code in {sorted(DTYPE_CODES)}, found {code}")
        self.dtype = np.dtype(DTYPE_CODES[code])
        expected = _HEADER.size + count * 4 + count * 8 + documents * 8
        if index.size != expected:
            raise DataError(
                f"{self.index_path}: expected {expected} bytes for {count} sequences and {documents} "
                f"document indices, found {index.size} (truncated or not an index)"
            )
        offset = _HEADER.size
        self.sizes = np.frombuffer(index, dtype=np.int32, count=count, offset=offset)
        self.pointers = np.frombuffer(index, dtype=np.int64, count=count, offset=offset + count * 4)
        if code in FLOAT_CODES:
            self.dtype = self._float_width(self.dtype)
        self.document_indices = np.frombuffer(index, dtype=np.int64, count=documents, offset=offset + count * 12)

    def _float_width(self, listed: np.dtype) -> np.dtype:
        """Codes 6 and 7 are float64 and float32 in Megatron-LM but float32 and float64 in GPT-NeoX (its
        precomputed reference log-probs are float32 under code 6): the width the file's own offsets
        and size imply decides."""
        values = int(self.sizes.sum(dtype=np.int64))
        if len(self.sizes) > 1 and self.sizes[0] > 0:
            width = (int(self.pointers[1]) - int(self.pointers[0])) // int(self.sizes[0])
        else:
            width = self.bin_path.stat().st_size // values if values else listed.itemsize
        return np.dtype({4: np.float32, 8: np.float64}.get(width, listed))

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.get(index)

    def get(self, index: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens `offset` to `offset + length` of sequence `index` (to its end when length is None)."""
        start = int(self.pointers[index]) // self.dtype.itemsize + offset
        stop = start - offset + int(self.sizes[index]) if length is None else start + length
        return self.tokens[start:stop]

    @property
    def num_tokens(self) -> int:
        return int(self.sizes.sum(dtype=np.int64))

    @functools.cached_property
    def sizes_digest(self) -> str:
        """A digest of the sequence lengths, naming index caches built from this dataset (computed once)."""
        return hashlib.md5(np.ascontiguousarray(self.sizes).tobytes()).hexdigest()


def _temporary_prefix(path: Path) -> str:
    """A hidden name beside `path` that says which process on which host writes it."""
    return f".{path.name}.{socket.gethostname()}.{os.getpid()}."


def remove_abandoned_temporaries(path: Path) -> None:
    """Delete the hidden temporaries of `path` that a writer on this host left when it was killed (its
    process is gone); a live writer's, or another host's, stay."""
    host = socket.gethostname()
    for temporary in path.parent.glob(f".{glob.escape(path.name)}.{glob.escape(host)}.*"):
        pid = temporary.name[len(f".{path.name}.{host}.") :].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            temporary.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class IndexedDatasetWriter:
    """Writes a `.bin/.idx` pair: `add_document(tokens)` appends one document (one sequence), or
    `add_sequence` several followed by `end_document`. The pair appears under its names only when the
    `with` block ends without an error."""

    def __init__(self, prefix: str | os.PathLike, dtype: np.dtype | type[np.generic]):
        self.dtype = np.dtype(dtype)
        if self.dtype not in CODE_OF:
            raise DataError(f"{prefix}: expected a token dtype in {sorted(map(str, CODE_OF))}, found {self.dtype}")
        self.index_path, self.bin_path = data_files(prefix)
        try:
            self.bin_path.parent.mkdir(parents=True, exist_ok=True)
            for path in (self.bin_path, self.index_path):
                remove_abandoned_temporaries(path)
            handle, self._bin_temporary = new_temporary(self.bin_path.parent, _temporary_prefix(self.bin_path))
        except OSError as error:
            raise DataError(
                f"{self.bin_path}: cannot be created: {_reason(error)}; expected a writable directory "
                "for the output prefix"
            ) from None
        self._bin = os.fdopen(handle, "wb")
        self.sizes: list[int] = []
        self.document_indices: list[int] = [0]

    def add_sequence(self, tokens: np.ndarray | list[int]) -> None:
        array = np.asarray(tokens)
        limits = np.iinfo(self.dtype) if self.dtype.kind in "iu" else None
        if array.size and limits and (array.min() < limits.min or array.max() > limits.max):
            raise DataError(f"{self.bin_path}: token ids {array.min()}..{array.max()} do not fit {self.dtype}")
        try:
            self._bin.write(array.astype(self.dtype, copy=False).tobytes(order="C"))
        except OSError as error:
            raise DataError(
                f"{self.bin_path}: writing failed after {self._bin.tell():,} bytes: {_reason(error)}; "
                "nothing was written under this name"
            ) from None
        self.sizes.append(array.size)

    def end_document(self) -> None:
        self.document_indices.append(len(self.sizes))

    def add_document(self, tokens: np.ndarray | list[int]) -> None:
        self.add_sequence(tokens)
        self.end_document()

    def __enter__(self) -> IndexedDatasetWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        try:
            self._bin.close()  # flushes the last tokens: a full disk may show only here
        except OSError as error:
            os.unlink(self._bin_temporary)
            if kind is None:
                raise DataError(
                    f"{self.bin_path}: writing failed: {_reason(error)}; nothing was written under this name"
                ) from None
            return
        if kind is not None:
            os.unlink(self._bin_temporary)
            return
        if self.document_indices[-1] != len(self.sizes):
            self.end_document()
        sizes = np.asarray(self.sizes, dtype=np.int32)
        pointers = np.zeros(len(sizes), dtype=np.int64)
        np.cumsum(sizes[:-1].astype(np.int64) * self.dtype.itemsize, out=pointers[1:])
        handle, index_temporary = new_temporary(self.index_path.parent, _temporary_prefix(self.index_path))
        try:
            with os.fdopen(handle, "wb") as index:
                index.write(_HEADER.pack(MAGIC, VERSION, CODE_OF[self.dtype], len(sizes), len(self.document_indices)))
                index.write(sizes.tobytes())
                index.write(pointers.tobytes())
                index.write(np.asarray(self.document_indices, dtype=np.int64).tobytes())
        except OSError as error:
            for temporary in (index_temporary, self._bin_temporary):
                os.unlink(temporary)
            raise DataError(
                f"{self.index_path}: writing failed: {_reason(error)}; nothing was written under this name"
            ) from None
        os.replace(self._bin_temporary, self.bin_path)  # tokens first: an index never points at missing data
        os.replace(index_temporary, self.index_path)


def _reason(error: OSError) -> str:
    """What the operating system said (e.g. "No space left on device", "Permission denied")."""
    return error.strerror or str(error)


def _inconsistent(sizes: np.ndarray, pointers: np.ndarray, itemsize: int) -> int | None:
    """The first sequence whose length is negative or whose byte offset does not follow from the lengths
    before it (Megatron's writer lays sequences back to back from offset 0); None when all agree."""
    expected = np.concatenate(([0], np.cumsum(sizes[:-1].astype(np.int64)) * itemsize))
    wrong = np.flatnonzero((sizes < 0) | (pointers != expected))
    return int(wrong[0]) if len(wrong) else None
