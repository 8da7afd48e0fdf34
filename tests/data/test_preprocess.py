"""jsonl -> .bin/.idx: tokens equal the tokenizer's own, whatever the compression and worker count."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import zstandard
from nxd_data import DataError, IndexedDataset, TokenizerSource, load_tokenizer, preprocess_jsonl
from tokenizers import Tokenizer

from tests.conftest import TEXT


def write_jsonl(path: Path, records: list[dict], compress: str = "") -> Path:
    text = "".join(json.dumps(record) + "\n" for record in records)
    if compress == "gz":
        path = path.with_suffix(".jsonl.gz")
        path.write_bytes(gzip.compress(text.encode()))
    elif compress == "zst":
        path = path.with_suffix(".jsonl.zst")
        path.write_bytes(zstandard.ZstdCompressor().compress(text.encode()))
    else:
        path.write_text(text)
    return path


RECORDS = [{"text": line, "title": line[:9]} for line in TEXT[:40]]


@pytest.mark.parametrize("compress", ["", "gz", "zst"])
def test_documents_are_the_tokenizers_ids_plus_eod(tmp_path: Path, tokenizer_file: Path, compress: str) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", RECORDS, compress)
    summary = preprocess_jsonl([source], tmp_path / "out", tokenizer_file, append_eod=True, progress=False)
    reference = Tokenizer.from_file(str(tokenizer_file))
    eod = reference.token_to_id("<|endoftext|>")
    expected = [reference.encode(record["text"], add_special_tokens=False).ids + [eod] for record in RECORDS]
    dataset = IndexedDataset(tmp_path / "out_text_document")
    assert [dataset[i].tolist() for i in range(len(dataset))] == expected
    assert summary.documents == 40 and summary.tokens == sum(map(len, expected))
    assert summary.tokens_per_second > 0


def test_character_level_documents_are_their_utf8_bytes_then_zero(tmp_path: Path) -> None:
    """GPT-NeoX's CharLevelTokenizer (preprocess_data.py --tokenizer-type CharLevelTokenizer): bytes, eod 0."""
    records = [{"text": "héllo wörld"}, {"text": "€ 😀\n\tend"}]
    source = write_jsonl(tmp_path / "in.jsonl", records)
    preprocess_jsonl(
        [source], tmp_path / "out", TokenizerSource("CharLevelTokenizer", "megatron"), append_eod=True, progress=False
    )
    dataset = IndexedDataset(tmp_path / "out_text_document")
    assert [dataset[i].tolist() for i in range(len(dataset))] == [list(r["text"].encode()) + [0] for r in records]


def test_two_workers_write_the_same_files_as_one(tmp_path: Path, tokenizer_file: Path, monkeypatch) -> None:
    monkeypatch.setattr("nxd_data.preprocess.BATCH_LINES", 7)  # several batches in flight
    source = write_jsonl(tmp_path / "in.jsonl", RECORDS * 5)
    for workers in (1, 2):
        preprocess_jsonl(
            [source],
            tmp_path / f"w{workers}",
            tokenizer_file,
            json_keys=("text", "title"),
            workers=workers,
            progress=False,
        )
    for key in ("text", "title"):
        for suffix in (".bin", ".idx"):
            one = (tmp_path / f"w1_{key}_document{suffix}").read_bytes()
            assert one == (tmp_path / f"w2_{key}_document{suffix}").read_bytes()


def test_a_bad_line_names_file_and_line(tmp_path: Path, tokenizer_file: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "one"}\n{"text": "two"\n{"body": "three"}\n{"text": "four"}\n')
    with pytest.raises(DataError, match=r"in\.jsonl:2: expected a JSON object with string keys text"):
        preprocess_jsonl([source], tmp_path / "out", tokenizer_file, progress=False)
    assert not list(tmp_path.glob("out*"))
    summary = preprocess_jsonl([source], tmp_path / "out", tokenizer_file, skip_bad_lines=True, progress=False)
    assert summary.skipped_lines == 2 and summary.documents == 2
    assert len(IndexedDataset(tmp_path / "out_text_document")) == 2


def test_an_input_without_tokens_writes_nothing(tmp_path: Path, tokenizer_file: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": ""}, {"text": ""}])
    with pytest.raises(DataError, match=r"in\.jsonl yielded no tokens for keys text; nothing was written"):
        preprocess_jsonl([source], tmp_path / "out", tokenizer_file, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_an_unknown_tokenizer_path_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"--tokenizer: expected a tokenizer.json file .* no such file .*nope"):
        load_tokenizer(tmp_path / "nope", "--tokenizer")
    with pytest.raises(DataError, match=r"a directory without tokenizer.json"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_a_truncated_compressed_file_is_named_as_truncated_even_when_skipping_bad_lines(
    tmp_path: Path, tokenizer_file: Path, compression: str
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", RECORDS * 20, compression)
    size = source.stat().st_size
    source.write_bytes(source.read_bytes()[: size // 2])  # cut inside the compressed stream
    for skip in (False, True):
        with pytest.raises(
            DataError,
            match=rf"in\.jsonl\.{compression}: truncated: after reading {size // 2:,} "
            "bytes the compressed stream has not reached its end marker",
        ):
            preprocess_jsonl([source], tmp_path / "out", tokenizer_file, progress=False, skip_bad_lines=skip)
        assert not list(tmp_path.glob("out*"))


def test_a_line_that_is_not_utf8_is_named_by_its_own_number(tmp_path: Path, tokenizer_file: Path) -> None:
    good = [json.dumps({"text": f"line {number} " + "x" * 300}) for number in range(40)]
    source = tmp_path / "in.jsonl"
    source.write_bytes(
        ("\n".join(good[:25]) + "\n").encode() + b'{"text": "bad \xff"}\n' + "\n".join(good[25:]).encode()
    )
    with pytest.raises(DataError, match=r"in\.jsonl:26: expected UTF-8 text, found byte 0xff at column 15"):
        preprocess_jsonl([source], tmp_path / "out", tokenizer_file, progress=False)
