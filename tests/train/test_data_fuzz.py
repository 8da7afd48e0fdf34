"""A scripted fuzz of data: good files broken one way at a time (empty, binary, missing, truncated,
bytes flipped, malformed lines, wrong types, token ids beyond the vocabulary) and given to the command
that reads them: `nxd-train data preprocess` (jsonl, .gz and .zst input, tokenizers), `nxd-train
config check` (Megatron .bin/.idx, Hugging Face rows, SFT records) and, for ids beyond the
vocabulary, which are found where a sample is read, a short training run. Each must answer with exit
0 or 1, never a traceback, and a refusal must name the file it is about (or the key that names it).
Damage no reader may accept (missing, empty or binary files, any damaged index or tokenizer, compressed
input cut short) must be refused. 176 cases drawn from a fixed seed, about 20 s in all."""

from __future__ import annotations

import gzip
import json
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import zstandard
from nxd_data import IndexedDataset, IndexedDatasetWriter
from nxd_train.cli import default_config_path, main

from tests.conftest import TEXT
from tests.training_runs import sft_records

SEED = 20261124


def _documents(count: int, seed: int) -> list[str]:
    generator = random.Random(seed)
    return [" ".join(generator.choices(TEXT, k=generator.randint(2, 6))) for _ in range(count)]


@pytest.fixture(scope="module")
def good(tmp_path_factory, tokenizer_file) -> dict[str, Path]:
    """Every kind of good file once: jsonl (plain, .gz, .zst), the tokenizer, a preprocessed Megatron
    prefix, Hugging Face text rows and SFT records."""
    root = tmp_path_factory.mktemp("good")
    lines = "".join(json.dumps({"text": text}) + "\n" for text in _documents(60, 0)).encode()
    (root / "corpus.jsonl").write_bytes(lines)
    (root / "corpus.jsonl.gz").write_bytes(gzip.compress(lines))
    (root / "corpus.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    assert (
        main(
            [
                "data",
                "preprocess",
                "--input",
                str(root / "corpus.jsonl"),
                "--output-prefix",
                str(root / "c"),
                "--tokenizer",
                str(tokenizer_file),
                "--append-eod",
                "--no-progress",
            ]
        )
        == 0
    )
    (root / "rows.jsonl").write_bytes(lines)
    (root / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft_records(64, 0)))
    return {
        "jsonl": root / "corpus.jsonl",
        "gz": root / "corpus.jsonl.gz",
        "zst": root / "corpus.jsonl.zst",
        "tokenizer": tokenizer_file,
        "prefix": root / "c_text_document",
        "rows": root / "rows.jsonl",
        "sft": root / "sft.jsonl",
    }


@dataclass(frozen=True)
class Case:
    """One broken file: which good file it starts from, how it is broken, and which command reads it."""

    name: str
    source: str
    damage: Callable[[bytes, random.Random], bytes] | None
    """The broken bytes from the good ones; None: the file is missing."""
    reader: str
    suffix: str = ""


def _flip(data: bytes, rng: random.Random) -> bytes:
    position = rng.randrange(len(data))
    return data[:position] + bytes([data[position] ^ (1 << rng.randrange(8))]) + data[position + 1 :]


def _truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data))]


def _replace_line(text: str) -> Callable[[bytes, random.Random], bytes]:
    def damage(data: bytes, rng: random.Random) -> bytes:
        lines = data.split(b"\n")
        lines[rng.randrange(len(lines) - 1)] = text.encode("latin-1")
        return b"\n".join(lines)

    return damage


FIXED = {
    "empty": lambda data, rng: b"",
    "binary": lambda data, rng: bytes(rng.randrange(256) for _ in range(300)),
    "garbage tail": lambda data, rng: data + bytes(rng.randrange(256) for _ in range(40)),
}
JSON_LINES = {
    "not json": "{'text': 'single quotes'}",
    "json array": '["text", "a list"]',
    "missing key": '{"body": "no text key"}',
    "number text": '{"text": 12}',
    "null text": '{"text": null}',
    "non-utf-8 line": '{"text": "caf\xe9"}',
    "cut line": '{"text": "ends early',
    "nested": '{"text": {"a": [1, 2]}}',
}
SFT_LINES = {
    "missing output": '{"input": "a question"}',
    "list input": '{"input": [1, 2], "output": "x"}',
    "messages not list": '{"messages": "hello"}',
    "message without role": '{"messages": [{"content": "hi"}]}',
    "empty object": "{}",
}
ROW_LINES = {
    "ids as text": '{"input_ids": "1 2 3"}',
    "ids of strings": '{"input_ids": ["a", "b"]}',
    "negative ids": '{"input_ids": [-5, 3]}',
    "ids beyond vocabulary": '{"input_ids": [299999, 1]}',
}


def _cases() -> list[Case]:
    cases = []
    for source in ("jsonl", "gz", "zst"):
        cases += [Case(f"{source} {name}", source, damage, "preprocess") for name, damage in FIXED.items()]
        cases += [Case(f"{source} truncated {k}", source, _truncate, "preprocess") for k in range(8)]
        cases += [Case(f"{source} flipped {k}", source, _flip, "preprocess") for k in range(8)]
    cases += [Case(f"jsonl {name}", "jsonl", _replace_line(line), "preprocess") for name, line in JSON_LINES.items()]
    cases += [Case("jsonl missing", "jsonl", None, "preprocess")]
    cases += [Case(f"tokenizer {name}", "tokenizer", damage, "preprocess") for name, damage in FIXED.items()]
    cases += [Case(f"tokenizer truncated {k}", "tokenizer", _truncate, "preprocess") for k in range(6)]
    cases += [
        Case("tokenizer {}", "tokenizer", lambda data, rng: b"{}", "preprocess"),
        Case("tokenizer missing", "tokenizer", None, "preprocess"),
    ]
    for suffix in (".idx", ".bin"):
        cases += [Case(f"{suffix} {name}", "prefix", damage, "check", suffix) for name, damage in FIXED.items()]
        cases += [Case(f"{suffix} truncated {k}", "prefix", _truncate, "check", suffix) for k in range(10)]
        cases += [Case(f"{suffix} missing", "prefix", None, "check", suffix)]
    cases += [Case(f".idx flipped {k}", "prefix", _flip, "check", ".idx") for k in range(24)]
    for source, reader, lines in (("rows", "rows", {**JSON_LINES, **ROW_LINES}), ("sft", "sft", SFT_LINES)):
        cases += [Case(f"{source} {name}", source, damage, reader) for name, damage in FIXED.items()]
        cases += [Case(f"{source} {name}", source, _replace_line(line), reader) for name, line in lines.items()]
        cases += [Case(f"{source} truncated {k}", source, _truncate, reader) for k in range(5)]
        cases += [Case(f"{source} flipped {k}", source, _flip, reader) for k in range(6)]
        cases += [Case(f"{source} missing", source, None, reader)]
    return cases


CASES = _cases()


def _broken(case: Case, good: dict[str, Path], directory: Path) -> Path:
    """The case's broken file in `directory` (for a Megatron prefix: both files, one of them broken);
    the path a command is given."""
    rng = random.Random(f"{SEED}/{case.name}")
    original = good[case.source]
    if case.source == "prefix":
        for suffix in (".bin", ".idx"):
            shutil.copy(f"{original}{suffix}", directory / f"p{suffix}")
        target, given = directory / f"p{case.suffix}", directory / "p"
    else:
        target = given = directory / original.name
    if case.damage is None:
        target.unlink(missing_ok=True)
    else:
        target.write_bytes(case.damage(Path(f"{original}{case.suffix}").read_bytes(), rng))
    return given


def _command(case: Case, given: Path, good: dict[str, Path], directory: Path) -> list[str]:
    if case.reader == "preprocess":
        tokenizer = given if case.source == "tokenizer" else good["tokenizer"]
        data = given if case.source != "tokenizer" else good["jsonl"]
        return [
            "data",
            "preprocess",
            "--input",
            str(data),
            "--output-prefix",
            str(directory / "out"),
            "--tokenizer",
            str(tokenizer),
            "--no-progress",
        ]
    data = {
        "check": [
            f"+data.data_prefix={given}",
            "+data.splits_string='80,10,10'",
            f"+data.index_mapping_dir={directory / 'index'}",
        ],
        "rows": [f"+data.train_dir={given}"],
        "sft": ["+model_alignment_strategy.sft.packing=True", f"+data.train_dir={given}"],
    }[case.reader]
    return ["config", "check", str(default_config_path()), f"+data.tokenizer.type={good['tokenizer']}", *data]


def _must_refuse(case: Case) -> bool:
    """Damage no reader may accept: a missing, empty or binary file, any damage to a tokenizer or an
    index, a compressed file cut short, a .bin shorter than its index says."""
    return (
        case.damage is None
        or case.name.endswith(("empty", "binary"))
        or case.source == "tokenizer"
        or case.suffix == ".idx"
        or (case.suffix == ".bin" and "truncated" in case.name)
        or (case.source in ("gz", "zst") and "truncated" in case.name)
    )


def _in_default_suite(case: Case) -> bool:
    """Every fixed damage and missing file, and the first two truncated and flipped draws of each reader's file (all
    of them with --runslow)."""
    drawn = re.search(r" (truncated|flipped) (\d+)$", case.name)
    return drawn is None or int(drawn.group(2)) < 2


@pytest.mark.parametrize(
    "case",
    [pytest.param(case, marks=() if _in_default_suite(case) else pytest.mark.slow) for case in CASES],
    ids=[case.name for case in CASES],
)
def test_broken_data_gets_a_message_naming_the_file(case, good, tmp_path, capsys):
    given = _broken(case, good, tmp_path)
    code = main(_command(case, given, good, tmp_path))
    out, err = capsys.readouterr()
    assert code in (0, 1), (case.name, code, err[-2000:])
    assert "Traceback" not in out + err, (case.name, err[-2000:])
    assert code == 1 or not _must_refuse(case), (case.name, "accepted")
    if code == 1:
        problems = [line for line in err.splitlines() if line.strip() and not line.startswith("notice:")]
        named = (str(given), str(given.parent / "p."), "data.train_dir", "data.data_prefix", "--input", "--tokenizer")
        assert any(name in line for line in problems for name in named), (case.name, err)


def test_the_fuzz_has_enough_cases():
    assert len(CASES) == 176


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_ids_beyond_the_vocabulary_stop_training_naming_the_file_and_document(where, good, tmp_path, capsys):
    """A .bin whose document holds an id the tokenizer does not have: the run stops with one message
    naming the .bin and the document, exit 1, wherever the document lies."""
    tokens = IndexedDataset(str(good["prefix"]))
    documents = [np.asarray(tokens[i]) for i in range(len(tokens))]
    bad = {"first": 0, "middle": len(documents) // 2, "last": len(documents) - 1}[where]
    documents[bad] = documents[bad].copy()
    documents[bad][len(documents[bad]) // 2] = 300 + bad  # the tokenizer has ids 0-299
    with IndexedDatasetWriter(str(tmp_path / "p"), np.uint16) as writer:
        for document in documents:
            writer.add_document(document.tolist())
    code = main(
        [
            f"+data.tokenizer.type={good['tokenizer']}",
            f"+data.data_prefix={tmp_path / 'p'}",
            "+data.splits_string='100,0,0'",
            "trainer.max_steps=4",
            "model.optim.sched.max_steps=4",
            "data.global_batch_size=32",
            "data.micro_batch_size=32",
            "trainer.limit_val_batches=0",
            "exp_manager.create_tensorboard_logger=False",
            f"+exp_manager.explicit_log_dir={tmp_path / 'log'}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err[-3000:]
    assert f"{tmp_path / 'p'}.bin: document {bad} holds token id {300 + bad}" in err, err[-3000:]
