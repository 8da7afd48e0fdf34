"""Supervised fine-tuning records: tokens and labels against the tokenizer used directly, truncation,
best-fit packing worked by hand, conversations, and one clear error per kind of bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import datasets
import numpy as np
import pytest
import zstandard
from nxd_data import DataError, load_tokenizer, sft_dataset
from nxd_data.sft import pack_best_fit
from tokenizers import Tokenizer

IGNORED = -100
RECORDS = [
    {"input": "the quick brown fox", "output": "jumps over the lazy dog"},
    {"input": "pack my box", "output": "with five dozen liquor jugs"},
    {"input": "how vexingly", "output": "quick daft zebras jump"},
]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def encode(tokenizer_dir: Path, text: str) -> list[int]:
    return Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def special(tokenizer_dir: Path, token: str) -> int:
    return Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).token_to_id(token)


def dataset(tmp_path: Path, tokenizer_dir: Path, records: list, seq_length: int = 32, packing: bool = False, **kw):
    source = write_jsonl(tmp_path / "train.jsonl", records)
    return sft_dataset(
        str(source), "data.train_dir", "train", load_tokenizer(tokenizer_dir), seq_length, packing=packing, **kw
    )


def test_a_record_is_bos_prompt_response_eos_with_labels_on_the_response(tmp_path, chat_tokenizer_dir):
    rows = dataset(tmp_path, chat_tokenizer_dir, RECORDS)
    bos, eos = special(chat_tokenizer_dir, "<s>"), special(chat_tokenizer_dir, "<|endoftext|>")
    prompt = [bos, *encode(chat_tokenizer_dir, RECORDS[0]["input"])]
    response = [*encode(chat_tokenizer_dir, RECORDS[0]["output"]), eos]
    tokens = prompt + response
    row = rows[0]
    assert "document_ids" not in row  # one record per row: causal attention never reaches the padding after it
    assert row["input_ids"].tolist() == tokens + [eos] * (32 - len(tokens))
    # label i is token i + 1 where that token is a response token; BOS, prompt and padding are ignored
    assert row["labels"].tolist() == [IGNORED] * (len(prompt) - 1) + response + [IGNORED] * (33 - len(tokens))
    assert row["position_ids"].tolist() == list(range(32))
    assert (row["labels"] != IGNORED).sum().item() == len(response)


def test_a_long_response_loses_its_end_and_a_long_prompt_its_start(tmp_path, chat_tokenizer_dir):
    bos = special(chat_tokenizer_dir, "<s>")
    long_text = " ".join(["the quick brown fox"] * 10)
    prompt = [bos, *encode(chat_tokenizer_dir, "pack my box")]
    rows = dataset(tmp_path, chat_tokenizer_dir, [{"input": "pack my box", "output": long_text}], seq_length=16)
    row = rows[0]
    assert row["input_ids"].tolist() == (prompt + encode(chat_tokenizer_dir, long_text))[:16]  # no EOS: cut short
    assert (row["labels"] != IGNORED).sum().item() == 16 - len(prompt)
    rows = dataset(tmp_path, chat_tokenizer_dir, [{"input": long_text, "output": "jumps"}], seq_length=16)
    row = rows[0]
    assert row["input_ids"][0].item() == bos
    assert row["input_ids"][1:15].tolist() == encode(chat_tokenizer_dir, long_text)[-14:]  # the prompt's end
    assert row["input_ids"][15].item() == encode(chat_tokenizer_dir, "jumps")[0]  # one response token kept
    assert row["labels"].tolist() == [IGNORED] * 14 + [row["input_ids"][15].item(), IGNORED]
    assert "1 truncated" in rows.summary("data.train_dir")


def test_best_fit_decreasing_by_hand():
    # longest first: 6 opens row 0 (room 2); 5 and 4 fit nowhere, opening rows 1 (room 3) and 2 (room 4);
    # 3 fits row 1 exactly; 2 fits row 0 exactly (the least room that holds it)
    assert pack_best_fit(np.array([5, 3, 4, 2, 6]), 8) == [[3, 4], [0, 1], [2]]
    assert pack_best_fit(np.array([8, 8]), 8) == [[0], [1]]


def test_packed_rows_keep_records_apart(tmp_path, chat_tokenizer_dir):
    unpacked = dataset(tmp_path, chat_tokenizer_dir, RECORDS, seq_length=64)
    packed = dataset(tmp_path, chat_tokenizer_dir, RECORDS, seq_length=64, packing=True)
    assert len(packed) == 1 and packed.rows == [[0, 1, 2]]
    row = packed[0]
    lengths = [
        len(encode(chat_tokenizer_dir, r["input"])) + len(encode(chat_tokenizer_dir, r["output"])) + 2 for r in RECORDS
    ]
    at = 0
    for number, length in enumerate(lengths):
        alone = unpacked[number]
        assert row["input_ids"][at : at + length].tolist() == alone["input_ids"][:length].tolist()
        assert row["labels"][at : at + length].tolist() == alone["labels"][:length].tolist()  # no label crosses
        assert row["position_ids"][at : at + length].tolist() == list(range(length))
        assert row["document_ids"][at : at + length].tolist() == [number] * length
        at += length
    assert row["labels"][at:].eq(IGNORED).all() and row["document_ids"][at:].eq(3).all()  # padding: its own document
    assert packed.fill == pytest.approx(sum(lengths) / 64)
    assert f"{sum(lengths) / 64:.1%} filled" in packed.summary("data.train_dir")


def test_conversations_learn_the_assistant_turns_only(tmp_path, chat_tokenizer_dir):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "the quick brown fox"},
        {"role": "assistant", "content": "jumps over"},
        {"role": "user", "content": "pack my box"},
        {"role": "assistant", "content": "with jugs"},
    ]
    rows = dataset(tmp_path, chat_tokenizer_dir, [{"messages": messages}], seq_length=96)
    text = "<s>" + "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    reference = Tokenizer.from_file(str(chat_tokenizer_dir / "tokenizer.json"))
    expected = reference.encode(text, add_special_tokens=False).ids
    row = rows[0]
    assert row["input_ids"][: len(expected)].tolist() == expected
    learned = [label for label in row["labels"].tolist() if label != IGNORED]
    assert reference.decode(learned, skip_special_tokens=False) == "jumps over<|im_end|>\nwith jugs<|im_end|>\n"


def test_a_conversation_cut_before_its_answer_is_skipped_and_counted(tmp_path, chat_tokenizer_dir):
    long = {
        "messages": [
            {"role": "user", "content": " ".join(["the quick brown fox"] * 10)},
            {"role": "assistant", "content": "jumps"},
        ]
    }
    rows = dataset(tmp_path, chat_tokenizer_dir, [long, *RECORDS], seq_length=24)
    assert len(rows) == 3
    assert "4 records (1 skipped (no response token within seq_length 24)" in rows.summary("data.train_dir")


def test_compressed_and_hugging_face_data_read_the_same(tmp_path, chat_tokenizer_dir):
    tokenizer = load_tokenizer(chat_tokenizer_dir)
    lines = "".join(json.dumps(record) + "\n" for record in RECORDS).encode()
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(lines))
    (tmp_path / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    datasets.Dataset.from_list(RECORDS).save_to_disk(str(tmp_path / "saved"))
    reference = dataset(tmp_path, chat_tokenizer_dir, RECORDS)
    for source in ("a.jsonl.gz", "a.jsonl.zst", "saved"):
        rows = sft_dataset(str(tmp_path / source), "data.train_dir", "train", tokenizer, 32, packing=False)
        assert [rows[i]["input_ids"].tolist() for i in range(3)] == [
            reference[i]["input_ids"].tolist() for i in range(3)
        ], source


def test_dev_choose_samples_takes_the_first_records_and_the_cache_is_reused(tmp_path, chat_tokenizer_dir):
    cache = tmp_path / "cache"
    first = dataset(tmp_path, chat_tokenizer_dir, RECORDS, limit=2, cache_dir=cache)
    assert len(first) == 2 and len(list(cache.glob("sft-*.npz"))) == 1
    again = sft_dataset(
        str(tmp_path / "train.jsonl"),
        "data.train_dir",
        "train",
        load_tokenizer(chat_tokenizer_dir),
        32,
        packing=False,
        limit=2,
        cache_dir=cache,
    )
    assert again[1]["input_ids"].tolist() == first[1]["input_ids"].tolist()
    assert len(list(cache.glob("sft-*.npz"))) == 1
    write_jsonl(tmp_path / "train.jsonl", RECORDS[::-1])  # changed data is tokenised anew
    changed = sft_dataset(
        str(tmp_path / "train.jsonl"),
        "data.train_dir",
        "train",
        load_tokenizer(chat_tokenizer_dir),
        32,
        packing=False,
        limit=2,
        cache_dir=cache,
    )
    last = RECORDS[2]
    tokens = [
        special(chat_tokenizer_dir, "<s>"),
        *encode(chat_tokenizer_dir, last["input"]),
        *encode(chat_tokenizer_dir, last["output"]),
        special(chat_tokenizer_dir, "<|endoftext|>"),
    ]
    assert changed[0]["input_ids"][: len(tokens)].tolist() == tokens
    assert len(list(cache.glob("sft-*.npz"))) == 2


BAD = [
    ([{"input": "a"}], "train.jsonl line 1: expected input and output strings (or messages), found keys input"),
    ([RECORDS[0], {"input": "a", "output": 3}], "train.jsonl line 2: output: expected a string, found int"),
    ([[1, 2]], "train.jsonl line 1: expected a JSON object, found list"),
    (
        [{"messages": [{"role": "robot", "content": "hi"}]}],
        "line 1: messages[0].role: expected one of system, user, assistant, tool, found 'robot'",
    ),
    (
        [{"messages": [{"role": "user", "content": "hi"}]}],
        "line 1: messages: expected at least one assistant turn to learn from, found none",
    ),
    (
        [{"messages": [{"role": "user", "content": ["hi"]}, {"role": "assistant", "content": "x"}]}],
        "line 1: messages[0].content: expected a string, found ['hi']",
    ),
    ([{"messages": []}], "line 1: expected messages to be a non-empty list of {role, content} objects, found []"),
]


@pytest.mark.parametrize(("records", "message"), BAD)
def test_bad_records_are_named_by_file_and_line(tmp_path, chat_tokenizer_dir, records, message):
    with pytest.raises(
        DataError,
        match="^data.train_dir: .*"
        + message.replace("[", r"\[")
        .replace("]", r"\]")
        .replace("(", r"\(")
        .replace(")", r"\)")
        .replace("{", r"\{")
        .replace("}", r"\}"),
    ):
        dataset(tmp_path, chat_tokenizer_dir, records)


def test_invalid_json_empty_files_and_missing_templates_are_named(tmp_path, chat_tokenizer_dir, tokenizer_file):
    tokenizer = load_tokenizer(chat_tokenizer_dir)
    (tmp_path / "broken.jsonl").write_text(json.dumps(RECORDS[0]) + "\n{not json\n")
    with pytest.raises(DataError, match=r"broken.jsonl line 2: expected a JSON object, found invalid JSON"):
        sft_dataset(str(tmp_path / "broken.jsonl"), "data.train_dir", "train", tokenizer, 32, packing=False)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match=r"^data.val_dir: .*empty.jsonl holds no records$"):
        sft_dataset(str(tmp_path / "empty.jsonl"), "data.val_dir", "validation", tokenizer, 32, packing=False)
    write_jsonl(
        tmp_path / "chat.jsonl",
        [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}],
    )
    with pytest.raises(
        DataError,
        match=r"chat.jsonl line 1: a messages record needs the tokenizer's chat template; "
        r".*tokenizer.json has none",
    ):
        sft_dataset(
            str(tmp_path / "chat.jsonl"), "data.train_dir", "train", load_tokenizer(tokenizer_file), 32, packing=False
        )


def test_a_bad_row_of_hugging_face_data_is_named_by_its_row(tmp_path, chat_tokenizer_dir):
    datasets.Dataset.from_list([RECORDS[0], {"input": "pack my box", "output": None}]).save_to_disk(
        str(tmp_path / "saved")
    )
    with pytest.raises(DataError, match=r"^data.train_dir: .*saved row 1: output: expected a string, found NoneType$"):
        sft_dataset(
            str(tmp_path / "saved"), "data.train_dir", "train", load_tokenizer(chat_tokenizer_dir), 32, packing=False
        )
