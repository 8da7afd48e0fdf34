"""The older indexed format (`data_impl: cached`, magic TNTIDX) against files written here byte by byte as
GPT-NeoX's `IndexedDatasetBuilder.finalize` lays them out (megatron/data/indexed_dataset.py), not from
nxd's code: the documents read back, the samples cut from them equal those of the same documents in the
memory-mapped format, and a file of the other format or a damaged one is an error naming it."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from nxd_data import DataError, IndexedDataset, MegatronDataBuilder, SampleFormat

from tests.data.test_indexed import DOCUMENTS, write_by_hand

LEGACY_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float32": 6, "float64": 7, "uint16": 8}


def write_legacy(
    prefix: Path,
    documents: list[list],
    dtype: str,
    *,
    ends: list[int] | None = None,
    version: int = 1,
    element_size: int | None = None,
    shapes: list[tuple] | None = None,
) -> None:
    """NeoX's builder: add_item per array (data offsets in elements, one dimension entry per axis), then the
    header, dimension offsets, data offsets, dimensions and document indices as little-endian longs."""
    size = np.dtype(dtype).itemsize
    arrays = [np.asarray(d, dtype=dtype) for d in documents]
    if shapes:
        arrays = [array.reshape(shape) for array, shape in zip(arrays, shapes, strict=True)]
    data_offsets, dim_offsets, dims = [0], [0], []
    for array in arrays:
        data_offsets.append(data_offsets[-1] + array.size)
        dims.extend(array.shape)
        dim_offsets.append(dim_offsets[-1] + array.ndim)
    doc_idx = [0, *(ends if ends is not None else range(1, len(arrays) + 1))]
    index = b"TNTIDX\x00\x00" + struct.pack("<Q", version)
    index += struct.pack("<QQ", LEGACY_CODES[dtype], size if element_size is None else element_size)
    index += struct.pack("<QQ", len(data_offsets) - 1, len(dims)) + struct.pack("<Q", len(doc_idx))
    for longs in (dim_offsets, data_offsets, dims, doc_idx):
        index += struct.pack(f"<{len(longs)}q", *longs)
    Path(f"{prefix}.idx").write_bytes(index)
    Path(f"{prefix}.bin").write_bytes(b"".join(array.tobytes() for array in arrays))


@pytest.mark.parametrize("impl", ["cached", "infer"])
@pytest.mark.parametrize("dtype", ["uint16", "int32", "int64"])
def test_an_older_index_reads_its_documents(tmp_path: Path, impl: str, dtype: str) -> None:
    write_legacy(tmp_path / "old", DOCUMENTS, dtype, ends=[2, 4])  # two documents of two sequences each
    dataset = IndexedDataset(tmp_path / "old", impl=impl)
    assert dataset.dtype == np.dtype(dtype)
    assert [dataset[i].tolist() for i in range(len(dataset))] == DOCUMENTS
    assert dataset.sizes.tolist() == [3, 2, 1, 4] and dataset.document_indices.tolist() == [0, 2, 4]
    assert dataset.get(3, 1, 2).tolist() == DOCUMENTS[3][1:3] and dataset.num_tokens == 10


def test_float32_values_under_the_older_code_6(tmp_path: Path) -> None:
    values = [[0.5, -1.25], [3.0]]
    write_legacy(tmp_path / "logps", values, "float32")
    dataset = IndexedDataset(tmp_path / "logps", impl="cached")
    assert dataset.dtype == np.float32 and [dataset[i].tolist() for i in range(2)] == values


def test_samples_from_either_format_are_the_same(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    documents = [rng.integers(1, 500, rng.integers(3, 40)).tolist() for _ in range(60)]
    write_legacy(tmp_path / "old", documents, "uint16")
    write_by_hand(tmp_path / "new", documents, "uint16")
    built = {}
    for name, impl in (("old", "cached"), ("new", "mmap")):
        builder = MegatronDataBuilder(
            SampleFormat(seq_length=16, eod_id=0), seed=5, cache_dir=tmp_path / name / "c", impl=impl
        )
        built[name] = builder.build([str(tmp_path / name)], "90,5,5", [40, None, None])
    for split in ("train", "validation", "test"):
        old, new = built["old"][split], built["new"][split]
        assert len(old) == len(new) > 0
        for i in range(len(old)):
            assert old[i]["input_ids"].tolist() == new[i]["input_ids"].tolist()


def test_a_file_of_the_other_format_names_it_and_the_key(tmp_path: Path) -> None:
    write_legacy(tmp_path / "old", DOCUMENTS, "uint16")
    write_by_hand(tmp_path / "new", DOCUMENTS, "uint16")
    with pytest.raises(
        DataError,
        match=r"old\.idx: data_impl mmap expected a Megatron mmap index, found the older "
        r"cached format \(magic TNTIDX\); set data_impl: cached or infer",
    ):
        IndexedDataset(tmp_path / "old", impl="mmap")
    with pytest.raises(
        DataError,
        match=r"new\.idx: data_impl cached expected the older indexed format .* found "
        r"b'MMIDIDX\\x00\\x00'; set data_impl: mmap or infer",
    ):
        IndexedDataset(tmp_path / "new", impl="cached")


def _truncate(prefix: Path) -> None:
    index = Path(f"{prefix}.idx")
    index.write_bytes(index.read_bytes()[:-8])


def _shift_an_offset(prefix: Path) -> None:
    index = bytearray(Path(f"{prefix}.idx").read_bytes())
    at = 56 + 8 * 5 + 8 * 2  # the third data offset (after five dimension offsets)
    index[at : at + 8] = struct.pack("<q", 7)
    Path(f"{prefix}.idx").write_bytes(bytes(index))


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (lambda p: write_legacy(p, DOCUMENTS, "uint16", version=2), r"old\.idx: expected index version 1, found 2"),
        (
            lambda p: write_legacy(p, DOCUMENTS, "int32", element_size=2),
            r"old\.idx: dtype code 4 \(int32\) has 4-byte elements, but the header states 2",
        ),
        (lambda p: (write_legacy(p, DOCUMENTS, "uint16"), _truncate(p)), r"old\.idx: expected 208 bytes .* found 200"),
        (
            lambda p: (write_legacy(p, DOCUMENTS, "uint16"), _shift_an_offset(p)),
            r"old\.idx: item 2: its data offset disagrees with the lengths before it",
        ),
        (
            lambda p: write_legacy(p, [[1, 2, 3, 4], [5]], "uint16", shapes=[(2, 2), (1,)]),
            r"old\.idx: item 0 has 2 dimensions; expected token sequences, one dimension each",
        ),
        (
            lambda p: write_legacy(p, DOCUMENTS, "uint16", ends=[3, 2, 4]),
            r"old\.idx: document index 2 is 2, below the one before it",
        ),
    ],
)
def test_a_damaged_older_index_names_the_file(tmp_path: Path, write, message: str) -> None:
    write(tmp_path / "old")
    with pytest.raises(DataError, match=message):
        IndexedDataset(tmp_path / "old", impl="infer")


def test_a_token_file_shorter_than_its_older_index_is_named(tmp_path: Path) -> None:
    write_legacy(tmp_path / "old", DOCUMENTS, "uint16")
    Path(tmp_path / "old.bin").write_bytes(Path(tmp_path / "old.bin").read_bytes()[:-2])
    with pytest.raises(DataError, match=r"old\.bin: expected exactly the 20 bytes of tokens .* found 18"):
        IndexedDataset(tmp_path / "old", impl="cached")
