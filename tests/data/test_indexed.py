"""The .bin/.idx format against a reader and a writer written here from the format description
(Megatron-LM MMapIndexedDataset / Megatron-core IndexedDataset), not from nxd's code."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from nxd_data import DataError, IndexedDataset, IndexedDatasetWriter, token_dtype

CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7, "uint16": 8}


def write_by_hand(
    prefix: Path,
    documents: list[list[int]],
    dtype: str,
    *,
    magic: bytes = b"MMIDIDX\x00\x00",
    version: int = 1,
    code: int | None = None,
) -> None:
    """An index and token file laid out byte by byte as the format description says."""
    itemsize = np.dtype(dtype).itemsize
    sizes = [len(document) for document in documents]
    pointers = [sum(sizes[:i]) * itemsize for i in range(len(sizes))]
    header = magic + struct.pack("<Q", version) + struct.pack("<B", CODES[dtype] if code is None else code)
    header += struct.pack("<Q", len(sizes)) + struct.pack("<Q", len(sizes) + 1)
    body = struct.pack(f"<{len(sizes)}i", *sizes) + struct.pack(f"<{len(sizes)}q", *pointers)
    body += struct.pack(f"<{len(sizes) + 1}q", *range(len(sizes) + 1))
    Path(f"{prefix}.idx").write_bytes(header + body)
    Path(f"{prefix}.bin").write_bytes(b"".join(np.asarray(d, dtype=dtype).tobytes() for d in documents))


def read_by_hand(prefix: Path) -> tuple[str, list[list[int]], list[int]]:
    """dtype name, documents and document indices, parsed with struct from the description."""
    raw = Path(f"{prefix}.idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack_from("<Q", raw, 9)
    (code,) = struct.unpack_from("<B", raw, 17)
    count, doc_count = struct.unpack_from("<QQ", raw, 18)
    assert version == 1
    sizes = struct.unpack_from(f"<{count}i", raw, 34)
    pointers = struct.unpack_from(f"<{count}q", raw, 34 + 4 * count)
    doc_idx = list(struct.unpack_from(f"<{doc_count}q", raw, 34 + 12 * count))
    assert len(raw) == 34 + 12 * count + 8 * doc_count
    dtype = next(name for name, c in CODES.items() if c == code)
    tokens = Path(f"{prefix}.bin").read_bytes()
    item = np.dtype(dtype).itemsize
    documents = [
        np.frombuffer(tokens[p : p + s * item], dtype=dtype).tolist() for p, s in zip(pointers, sizes, strict=True)
    ]
    return dtype, documents, doc_idx


DOCUMENTS = [[5, 1, 7], [300, 2], [9], [65535, 0, 4, 4]]


@pytest.mark.parametrize("dtype", ["uint16", "int32", "int64", "uint8"])
def test_reads_a_file_built_byte_by_byte(tmp_path: Path, dtype: str) -> None:
    documents = [[t % 256 for t in d] for d in DOCUMENTS] if dtype == "uint8" else DOCUMENTS
    write_by_hand(tmp_path / "hand", documents, dtype)
    dataset = IndexedDataset(tmp_path / "hand")
    assert dataset.dtype == np.dtype(dtype)
    assert [dataset[i].tolist() for i in range(len(dataset))] == documents
    assert dataset.document_indices.tolist() == [0, 1, 2, 3, 4]
    assert dataset.get(3, 1, 2).tolist() == documents[3][1:3]
    assert dataset.num_tokens == 10


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_our_files_read_by_the_description(tmp_path: Path, dtype: type) -> None:
    with IndexedDatasetWriter(tmp_path / "ours", dtype) as writer:
        for document in DOCUMENTS[:3]:
            writer.add_document(document)
        writer.add_sequence([1, 2])  # one document of two sequences
        writer.add_sequence([3])
        writer.end_document()
    name, documents, doc_idx = read_by_hand(tmp_path / "ours")
    assert name == np.dtype(dtype).name
    assert documents == DOCUMENTS[:3] + [[1, 2], [3]]
    assert doc_idx == [0, 1, 2, 3, 5]


def test_token_dtype_follows_the_vocabulary() -> None:
    assert token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.int32


def test_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="do not fit uint16"), IndexedDatasetWriter(tmp_path / "x", np.uint16) as w:
        w.add_document([1, 2])
        w.add_document([70000])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ({"magic": b"NOTMAGIC\x00"}, r"x\.idx: expected the magic"),
        ({"version": 2}, r"x\.idx: expected index version 1, found 2"),
        ({"code": 9}, r"x\.idx: expected a dtype code in \[1, 2, 3, 4, 5, 6, 7, 8\], found 9"),
    ],
)
def test_bad_index_headers_name_the_file(tmp_path: Path, damage: dict, message: str) -> None:
    write_by_hand(tmp_path / "x", DOCUMENTS, "uint16", **damage)
    with pytest.raises(DataError, match=message):
        IndexedDataset(tmp_path / "x")


def test_truncated_files_name_the_file(tmp_path: Path) -> None:
    write_by_hand(tmp_path / "x", DOCUMENTS, "uint16")
    tokens = (tmp_path / "x.bin").read_bytes()
    (tmp_path / "x.bin").write_bytes(tokens[:-2])
    with pytest.raises(
        DataError,
        match=r"x\.bin: expected exactly the 20 bytes of tokens .*x\.idx describes \(4 "
        r"sequences\), found 18 \(truncated\?\)",
    ):
        IndexedDataset(tmp_path / "x")
    (tmp_path / "x.bin").write_bytes(tokens)
    index = (tmp_path / "x.idx").read_bytes()
    (tmp_path / "x.idx").write_bytes(index[:-5])
    with pytest.raises(DataError, match=r"x\.idx: expected .* bytes for 4 sequences"):
        IndexedDataset(tmp_path / "x")


def test_an_index_of_another_token_file_is_refused_naming_both(tmp_path: Path) -> None:
    """An .idx from another (smaller) data set beside a .bin: every offset it holds lies inside the bin, so
    only the total tells them apart; training on it would read misaligned documents."""
    write_by_hand(tmp_path / "x", DOCUMENTS, "uint16")
    write_by_hand(tmp_path / "other", DOCUMENTS[:2], "uint16")
    (tmp_path / "x.idx").write_bytes((tmp_path / "other.idx").read_bytes())
    with pytest.raises(
        DataError,
        match=r"x\.bin: expected exactly the \d+ bytes of tokens .*x\.idx describes \(2 "
        r"sequences\), found 20 \(an index written for another token file\?\)",
    ):
        IndexedDataset(tmp_path / "x")


def test_a_missing_prefix_names_both_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data prefix .*nothing: expected nothing\.idx and nothing\.bin, missing"):
        IndexedDataset(tmp_path / "nothing")


@pytest.mark.parametrize("length", [2**30, -1, 0])
def test_a_sequence_length_changed_in_place_is_refused(tmp_path: Path, length: int) -> None:
    """The .idx keeps its size (a length rewritten in place, as a bad copy or a bit flip would): the
    lengths no longer lead from one offset to the next, which names the file and the sequence."""
    write_by_hand(tmp_path / "x", DOCUMENTS, "uint16")
    index = bytearray((tmp_path / "x.idx").read_bytes())
    struct.pack_into("<i", index, 9 + 8 + 1 + 8 + 8 + 1 * 4, length)  # after the header: sequence 1
    (tmp_path / "x.idx").write_bytes(bytes(index))
    with pytest.raises(DataError, match=r"x\.idx: sequence [12]: its length .* the index is damaged"):
        IndexedDataset(tmp_path / "x")


def test_an_output_prefix_that_cannot_be_created_is_named(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("")
    with pytest.raises(DataError, match=r"a_file/out\.bin: cannot be created: .*expected a writable directory"):
        IndexedDatasetWriter(tmp_path / "a_file" / "out", np.uint16)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device that is always full)")
def test_a_full_disk_is_said_plainly_and_leaves_nothing(tmp_path: Path) -> None:
    full = r"out\.bin: writing failed.*No space left on device; nothing was written"
    with pytest.raises(DataError, match=full), IndexedDatasetWriter(tmp_path / "out", np.uint16) as writer:
        writer._bin.close()
        writer._bin = open("/dev/full", "wb")  # noqa: SIM115 - the writer closes it
        for _ in range(10):
            writer.add_document(list(range(1000)))
    assert sorted(path.name for path in tmp_path.iterdir()) == []
