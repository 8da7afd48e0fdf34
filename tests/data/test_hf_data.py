"""Hugging Face data: saved folders, jsonl and parquet, pre-tokenised or text."""

from __future__ import annotations

import json
import sys
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


def test_given_labels_and_attention_masks_decide_what_is_learned(tmp_path: Path) -> None:
    """transformers' convention, as NxDT's HF datasets hold it: labels unshifted (-100: no loss), the
    attention mask 0 on padding; position t learns labels[t + 1]."""
    row = {
        "input_ids": [[7, 8, 9, 10, 11, 0, 0, 0]],
        "labels": [[7, -100, 9, 10, 12, -100, -100, -100]],
        "attention_mask": [[1, 1, 1, 1, 1, 0, 0, 0]],
    }
    datasets.Dataset.from_dict(row).save_to_disk(str(tmp_path / "saved"))
    sample = hf_pretraining_dataset(str(tmp_path / "saved"), "data.train_dir", "train", FORMAT, None, tmp_path)[0]
    assert sample["input_ids"].tolist() == [7, 8, 9, 10, 11, 0, 0, 0]
    # by hand: t=0 learns labels[1] (-100), t=1 labels[2]=9, t=2 10, t=3 12 (the given label, not input 11),
    # t=4..6 are padding (mask 0), t=7 has no next token
    assert sample["labels"].tolist() == [-100, 9, 10, 12, -100, -100, -100, -100]


def test_ids_outside_the_vocabulary_are_named_by_row(tmp_path: Path) -> None:
    datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5], [6, 300, 7]]}).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(
        DataError,
        match=r"data.train_dir \(.*saved\): row 2 holds token id 300; expected ids in "
        r"\[0, 300\) \(the model's vocabulary\)",
    ):
        hf_pretraining_dataset(
            str(tmp_path / "saved"), "data.train_dir", "train", FORMAT, None, tmp_path, vocab_size=300
        )
    datasets.Dataset.from_dict({"input_ids": [[1, -4]]}).save_to_disk(str(tmp_path / "negative"))
    with pytest.raises(DataError, match=r"row 0 holds token id -4"):
        hf_pretraining_dataset(
            str(tmp_path / "negative"), "data.train_dir", "train", FORMAT, None, tmp_path, vocab_size=300
        )


def test_without_datasets_hugging_face_data_names_the_extra_that_installs_it(tmp_path, monkeypatch):
    (tmp_path / "rows.jsonl").write_text('{"text": "a"}\n')
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    fmt = SampleFormat(seq_length=8, eod_id=0)
    with pytest.raises(
        DataError,
        match=r"data.train_dir: Hugging Face data is read with the datasets package, which "
        r"is not installed; install nxd-data\[hf\]",
    ):
        hf_pretraining_dataset(str(tmp_path / "rows.jsonl"), "data.train_dir", "train", fmt, None, tmp_path)
