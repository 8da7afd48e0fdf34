"""The older indexed format as GPT-NeoX's and Megatron's `IndexedDataset` write it (`data_impl: cached`;
fairseq's, from which it comes, has no document index), read into the arrays the memory-mapped format holds,
so every dataset above it reads both.

The layout (GPT-NeoX `megatron/data/indexed_dataset.py`, `IndexedDatasetBuilder.finalize`), little-endian:

    .idx  magic b"TNTIDX\\x00\\x00" | version u64 = 1 | dtype code u64 | element size u64 |
          item count n u64 | dimension count s u64 | document-index count d u64 |
          dimension offsets int64[n + 1] | data offsets int64[n + 1] (in elements) |
          dimensions int64[s] | document indices int64[d]
    .bin  the elements of every item, back to back

Token files hold one-dimensional items, so the dimensions are the sequence lengths. Its dtype codes 6
and 7 are float32 and float64; the element size the header states decides the width.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DataError

LEGACY_MAGIC = b"TNTIDX\x00\x00"
_HEADER = struct.Struct("<8sQQQQQQ")
_CODES: dict[int, type[np.generic]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float32,
    7: np.float64,
    8: np.uint16,
}


@dataclass(frozen=True)
class LegacyIndex:
    """What an older `.idx` describes, in the memory-mapped format's terms: byte pointers, not elements."""

    dtype: np.dtype
    sizes: np.ndarray
    pointers: np.ndarray
    document_indices: np.ndarray


def read_legacy_index(path: Path) -> LegacyIndex:
    """The index at `path`; every inconsistency is a DataError naming the file."""
    data = path.read_bytes()
    if len(data) < _HEADER.size:
        raise DataError(f"{path}: expected an index header of {_HEADER.size} bytes, found a {len(data)}-byte file")
    _, version, code, element_size, count, dimensions, documents = _HEADER.unpack_from(data)
    if version != 1:
        raise DataError(f"{path}: expected index version 1, found {version}")
    if code not in _CODES:
        raise DataError(f"{path}: expected a dtype code in {sorted(_CODES)}, found {code}")
    dtype = np.dtype(_CODES[code])
    if element_size != dtype.itemsize:
        raise DataError(
            f"{path}: dtype code {code} ({dtype}) has {dtype.itemsize}-byte elements, but the header "
            f"states {element_size}"
        )
    expected = _HEADER.size + 8 * (2 * (count + 1) + dimensions + documents)
    if len(data) != expected:
        raise DataError(
            f"{path}: expected {expected} bytes for {count} items, {dimensions} dimensions and "
            f"{documents} document indices, found {len(data)} (truncated or not an index)"
        )
    longs = np.frombuffer(data, dtype="<i8", offset=_HEADER.size)
    dim_offsets, data_offsets = longs[: count + 1], longs[count + 1 : 2 * count + 2]
    sizes = longs[2 * count + 2 : 2 * count + 2 + dimensions]
    if dim_offsets[0] != 0:
        raise DataError(f"{path}: expected dimension offsets from 0, found {int(dim_offsets[0])}; the index is damaged")
    if (ranks := np.diff(dim_offsets)).size and (other := np.flatnonzero(ranks != 1)).size:
        raise DataError(
            f"{path}: item {int(other[0])} has {int(ranks[other[0]])} dimensions; expected token "
            "sequences, one dimension each"
        )
    if dimensions != count:
        raise DataError(f"{path}: expected one dimension per item, found {dimensions} for {count} items")
    if (wrong := np.flatnonzero(data_offsets != np.concatenate(([0], np.cumsum(sizes))))).size:
        at = min(int(wrong[0]), max(count - 1, 0))
        raise DataError(
            f"{path}: item {at}: its data offset disagrees with the lengths "
            "before it (each item must start where the previous one ends); the index is "
            "damaged"
        )
    if (sizes > np.iinfo(np.int32).max).any() or (sizes < 0).any():
        raise DataError(
            f"{path}: expected item lengths from 0 to {np.iinfo(np.int32).max}, found "
            f"{int(sizes.min())}..{int(sizes.max())}"
        )
    return LegacyIndex(
        dtype, sizes.astype(np.int32), data_offsets[:-1] * dtype.itemsize, longs[2 * count + 2 + dimensions :].copy()
    )
