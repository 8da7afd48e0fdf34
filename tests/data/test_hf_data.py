"""Hugging Face data: saved folders, jsonl and parquet, pre-tokenised or text."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from nxd_data import DataError, SampleFormat, hf_pretraining_dataset, load_tokenizer
from tokenizers import Tokenizer

from tests.conftest import TEXT

FORMAT = SampleFormat(seq_length=8, eod_id=0)


def test_pre_tokenised_rows_are_samples(tmp_path: Path) -> None:
    rows = [list(range(r, r + 9)) for r in range(6)] + [[1, 2, 3]]
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(str(tmp_path / "saved"))
    dataset = hf_pretraining_dataset(str(tmp_path / "saved"), "data.train_dir", "train", FORMAT, None, tmp_path)
    assert len(dataset) == 7
    assert dataset[2]["input_ids"].tolist() == rows[2][:8]
    assert dataset[2]["labels"].tolist() == rows[2][1:]
    assert dataset[6]["labels"].tolist() == [2, 3] + [-100] * 6  # a short row: padding is not learned
    limited = hf_pretraining_dataset(str(tmp_path / "saved"), "data.train_dir", "train", FORMAT, None, tmp_path, 3)
    assert len(limited) == 3


def test_text_is_tokenised_and_packed(tmp_path: Path, tokenizer_file: Path) -> None:
    source = tmp_path / "train.jsonl"
    source.write_text("".join(json.dumps({"text": line}) + "\n" for line in TEXT[:8]))
    tokenizer = load_tokenizer(tokenizer_file)
    fmt = SampleFormat(seq_length=8, eod_id=tokenizer.eod_id)
    dataset = hf_pretraining_dataset(str(source), "data.train_dir", "train", fmt, tokenizer, tmp_path / "cache")
    reference = Tokenizer.from_file(str(tokenizer_file))
    stream = sum((reference.encode(line, add_special_tokens=False).ids + [tokenizer.eod_id] for line in TEXT[:8]), [])
    assert len(dataset) == (len(stream) - 1) // 8
    assert dataset[3]["input_ids"].tolist() == stream[24:32]
    assert dataset[3]["labels"].tolist() == stream[25:33]


def test_parquet_files(tmp_path: Path) -> None:
    datasets.Dataset.from_dict({"input_ids": [[5] * 9] * 4}).to_parquet(str(tmp_path / "part.parquet"))
    dataset = hf_pretraining_dataset(
        str(tmp_path / "part.parquet"), "data.val_dir", "validation", FORMAT, None, tmp_path
    )
    assert len(dataset) == 4


@pytest.mark.parametrize(
    ("records", "tokenizer", "message"),
    [
        ({"input_ids": [[1] * 12]}, False, r"data.train_dir \(.*\): row 0 has 12 input_ids; expected at most 9"),
        ({"body": ["x"]}, False, r"has columns body; expected input_ids \(pre-tokenised\) or text"),
        ({"text": ["x"]}, False, r"holds text; expected data.tokenizer to tokenise it"),
    ],
)
def test_bad_data_is_named(tmp_path: Path, records: dict, tokenizer: bool, message: str) -> None:
    datasets.Dataset.from_dict(records).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(DataError, match=message):
        hf_pretraining_dataset(str(tmp_path / "saved"), "data.train_dir", "train", FORMAT, None, tmp_path)


def test_a_missing_path_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data.train_dir: expected a datasets.save_to_disk folder .* no such file"):
        hf_pretraining_dataset(str(tmp_path / "none"), "data.train_dir", "train", FORMAT, None, tmp_path)
