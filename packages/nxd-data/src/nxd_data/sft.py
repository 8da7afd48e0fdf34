"""Supervised fine-tuning data: records -> token rows whose loss is taken on the responses only.

Records come from jsonl (plain, .gz, .zst) or Hugging Face data (a `save_to_disk` folder, arrow or
parquet), in one of two forms:
- `{"input": str, "output": str}` (NxDT's SFT format): tokens are BOS + input + output + EOS, and the
  labels are ignored over BOS and the input;
- `{"messages": [{"role": ..., "content": ...}, ...]}`: the conversation rendered with the
  tokenizer's chat template; only the assistant turns are learned.

A record longer than `seq_length` is truncated to fit: an input/output record loses the end of its
response first (its EOS with it), and only when the input leaves no room for one response token
does it lose the start of its input (BOS kept); a conversation loses its end. A record left with no
response token is skipped and counted.

Rows: without packing, one record per row padded to `seq_length`. With packing, records are placed
by best-fit decreasing into rows of `seq_length` (each record in the fullest row that still holds
it, longest first), with `document_ids` confining each record's attention to itself and positions
restarting per record; padding is ignored in the loss. Packing is deterministic, so a resumed run
reads the same rows at the same positions.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from filelock import FileLock
from torch.utils.data import Dataset

from .chat import ChatRenderer, message_problem
from .errors import DataError
from .files import save_atomically
from .hf_data import load_records
from .jsonl import read_lines
from .samples import IGNORE_INDEX
from .tokenizer import TextTokenizer

JSON_LINES = (".jsonl", ".json")
COMPRESSED = (".gz", ".zst")
CACHE_VERSION = 1
"""Bumped whenever the tokenised form of a record changes."""


@dataclass(frozen=True)
class SFTRecords:
    """Tokenised records, concatenated: record r is tokens[starts[r]:starts[r] + lengths[r]], and
    `trained` marks its response tokens."""

    tokens: np.ndarray
    trained: np.ndarray
    lengths: np.ndarray
    read: int
    """Records read (skipped ones included)."""
    skipped: int
    """Records with no response token within seq_length."""
    truncated: int

    @property
    def starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)


def _is_json_lines(path: Path) -> bool:
    suffixes = path.suffixes[-2:] if path.suffix in COMPRESSED else path.suffixes[-1:]
    return path.is_file() and bool(suffixes) and suffixes[0] in JSON_LINES


def read_records(location: str, where: str, split: str, limit: int | None = None) -> Iterator[tuple[str, Any]]:
    """(where it is, record) pairs of the SFT data at `location`: "FILE line N" for json lines, "FILE
    row N" for Hugging Face data; at most `limit` records. DataError for unreadable input."""
    path = Path(location)
    count = 0
    if _is_json_lines(path):
        try:
            for number, line in read_lines(path):
                if not line.strip():
                    continue
                if limit is not None and count >= limit:
                    break
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DataError(
                        f"{where}: {location} line {number}: expected a JSON object, found invalid JSON ({error.msg})"
                    ) from None
                count += 1
                yield f"{location} line {number}", record
        except DataError as error:
            if str(error).startswith(f"{where}: "):
                raise
            raise DataError(f"{where}: {error}") from None
        if count == 0:
            raise DataError(f"{where}: {location} holds no records")
        return
    records = load_records(location, where, split, limit)
    for number, record in enumerate(records):
        yield f"{location} row {number}", record


def _fields(record: Any, place: str, where: str) -> tuple[str, Any]:
    """("chat", messages) or ("pair", (input, output)) of a record; DataError naming its place otherwise."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: {place}: expected a JSON object, found {type(record).__name__}")
    if record.get("messages") is not None:
        if problem := message_problem(record["messages"]):
            raise DataError(f"{where}: {place}: {problem}")
        return "chat", record["messages"]
    missing = [name for name in ("input", "output") if name not in record]
    if missing:
        raise DataError(
            f"{where}: {place}: expected input and output strings (or messages), found keys "
            f"{', '.join(sorted(record)) or 'none'}"
        )
    for name in ("input", "output"):
        if not isinstance(record[name], str):
            raise DataError(f"{where}: {place}: {name}: expected a string, found {type(record[name]).__name__}")
    return "pair", (record["input"], record["output"])


def _pair_tokens(
    prompt: list[int], response: list[int], begin: int, end: int, seq_length: int
) -> tuple[list[int], list[bool], bool]:
    """BOS + prompt + response + EOS, cut to seq_length (see the module docstring); whether it was cut."""
    prompt, response = [begin, *prompt], [*response, end]
    truncated = len(prompt) + len(response) > seq_length
    if truncated:
        room = seq_length - len(prompt)
        if room >= 1:
            response = response[:room]
        else:  # the prompt's end (BOS kept) and one response token
            prompt, response = [begin, *prompt[len(prompt) - (seq_length - 2) :]], response[:1]
    return prompt + response, [False] * len(prompt) + [True] * len(response), truncated


def tokenize_records(
    records: Iterator[tuple[str, Any]], tokenizer: TextTokenizer, seq_length: int, where: str
) -> SFTRecords:
    """Every record tokenised with its response mask, truncated to `seq_length` (a DataError names the
    first bad record)."""
    tokens: list[np.ndarray] = []
    trained: list[np.ndarray] = []
    read = skipped = truncated = 0
    renderer: ChatRenderer | None = None
    pairs: list[tuple[str, str]] = []

    def keep(ids: list[int], mask: list[bool], cut: bool) -> None:
        nonlocal skipped, truncated
        if not any(mask[1:]):  # the first token has no label to learn
            skipped += 1
            return
        truncated += cut
        tokens.append(np.asarray(ids, dtype=np.int32))
        trained.append(np.asarray(mask, dtype=bool))

    def flush() -> None:
        if not pairs:
            return
        prompts = tokenizer.encode([prompt for prompt, _ in pairs])
        responses = tokenizer.encode([response for _, response in pairs])
        for prompt, response in zip(prompts, responses, strict=True):
            keep(*_pair_tokens(prompt, response, tokenizer.begin_id, tokenizer.eod_id, seq_length))
        pairs.clear()

    for place, record in records:
        read += 1
        kind, content = _fields(record, place, where)
        if kind == "pair":
            pairs.append(content)
            if len(pairs) >= 1024:
                flush()
            continue
        flush()  # records keep their order
        if renderer is None:
            if tokenizer.chat_template is None:
                raise DataError(
                    f"{where}: {place}: a messages record needs the tokenizer's chat template; "
                    f"{tokenizer.path} has none (expected chat_template in tokenizer_config.json or "
                    "a chat_template.jinja file)"
                )
            renderer = ChatRenderer(tokenizer)
        try:
            ids, mask = renderer.tokens(content)
        except DataError as error:
            raise DataError(f"{where}: {place}: {error}") from None
        keep(ids[:seq_length], mask[:seq_length], len(ids) > seq_length)
    flush()
    if not tokens:
        raise DataError(f"{where}: none of the {read} records keeps a response token within seq_length {seq_length}")
    lengths = np.asarray([len(t) for t in tokens], dtype=np.int64)
    return SFTRecords(np.concatenate(tokens), np.concatenate(trained), lengths, read, skipped, truncated)


def pack_best_fit(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Record indices per row: best-fit decreasing (longest record first, into the row with the least
    room that still holds it; ties by index). Each row's records keep increasing index order."""
    order = sorted(range(len(lengths)), key=lambda index: (-int(lengths[index]), index))
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, row number), sorted
    for index in order:
        size = int(lengths[index])
        position = bisect.bisect_left(free, (size, -1))
        if position < len(free):
            room, row = free.pop(position)
        else:
            room, row = capacity, len(rows)
            rows.append([])
        rows[row].append(index)
        if room - size > 0:
            bisect.insort(free, (room - size, row))
    return [sorted(row) for row in rows]


class SFTDataset(Dataset):
    """Rows of `seq_length` tokens from tokenised records (one record per row, or packed)."""

    def __init__(self, records: SFTRecords, seq_length: int, pad_id: int, packing: bool):
        self.records, self.seq_length, self.pad_id, self.packing = records, seq_length, pad_id, packing
        self.starts = records.starts
        self.rows = (
            pack_best_fit(records.lengths, seq_length)
            if packing
            else [[index] for index in range(len(records.lengths))]
        )

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def row_lengths(self) -> np.ndarray:
        """Tokens per row (the records it holds), int64."""
        return np.asarray([int(self.records.lengths[row].sum()) for row in self.rows], dtype=np.int64)

    @property
    def fill(self) -> float:
        """Real tokens over row capacity."""
        return float(self.records.lengths.sum()) / (len(self.rows) * self.seq_length)

    def summary(self, where: str) -> str:
        r = self.records
        skipped = f"{r.skipped} skipped (no response token within seq_length {self.seq_length}), " if r.skipped else ""
        layout = "packed into" if self.packing else "padded to"
        return (
            f"{where}: {r.read} records ({skipped}{r.truncated} truncated), {layout} {len(self.rows)} rows of "
            f"{self.seq_length} tokens, {self.fill:.1%} filled"
        )

    def _record(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        start, length = self.starts[index], self.records.lengths[index]
        return self.records.tokens[start : start + length], self.records.trained[start : start + length]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self._row([self._record(record) for record in self.rows[int(index)]])

    def padding(self) -> dict[str, torch.Tensor]:
        """A row that adds nothing to the loss (fills a short evaluation batch)."""
        return self._row([])

    def _row(self, records: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, torch.Tensor]:
        seq = self.seq_length
        input_ids = np.full(seq, self.pad_id, dtype=np.int64)
        labels = np.full(seq, IGNORE_INDEX, dtype=np.int64)
        positions = np.zeros(seq, dtype=np.int64)
        documents = np.full(seq, len(records), dtype=np.int64)  # padding is a document of its own
        at = 0
        for number, (tokens, trained) in enumerate(records):
            n = len(tokens)
            input_ids[at : at + n] = tokens
            labels[at : at + n - 1] = np.where(trained[1:], tokens[1:], IGNORE_INDEX)
            positions[at : at + n] = np.arange(n)
            documents[at : at + n] = number
            at += n
        positions[at:] = np.arange(seq - at) + (0 if self.packing else at)  # packed: padding is a document too
        sample = {
            "input_ids": torch.from_numpy(input_ids),
            "labels": torch.from_numpy(labels),
            "position_ids": torch.from_numpy(positions),
        }
        if self.packing:
            sample["document_ids"] = torch.from_numpy(documents)
        return sample


def _source_key(location: str) -> str:
    """What identifies the data at `location`: each file's path, size and modification time."""
    path = Path(location).resolve()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return ";".join(f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files if p.exists())


def sft_dataset(
    location: str,
    where: str,
    split: str,
    tokenizer: TextTokenizer,
    seq_length: int,
    *,
    packing: bool,
    cache_dir: Path | None = None,
    limit: int | None = None,
) -> SFTDataset:
    """The SFT rows of the data at `location` (see the module docstring). Tokenised records are cached
    in `cache_dir` under the data's, the tokenizer's and the length's fingerprint: the first process
    tokenises, the others wait and read."""

    if seq_length < 2:
        raise DataError(
            f"data.seq_length: expected at least 2 for fine-tuning records (a first token and one "
            f"response token), found {seq_length}"
        )

    def tokenized() -> SFTRecords:
        return tokenize_records(read_records(location, where, split, limit), tokenizer, seq_length, where)

    if cache_dir is None or not Path(location).exists():
        records = tokenized()
    else:
        key = hashlib.sha256(
            f"{CACHE_VERSION}|{_source_key(location)}|{split}|{limit}|{tokenizer.fingerprint}|{seq_length}".encode()
        ).hexdigest()[:16]
        path = cache_dir / f"sft-{key}.npz"
        cache_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{path}.lock"):
            if path.exists():
                with np.load(path) as saved:
                    records = SFTRecords(saved["tokens"], saved["trained"], saved["lengths"], *saved["counts"].tolist())
            else:
                records = tokenized()
                save_atomically(path, _npz(records))
    return SFTDataset(records, seq_length, tokenizer.eod_id, packing)


def _npz(records: SFTRecords) -> bytes:
    buffer = io.BytesIO()
    np.savez(
        buffer,
        tokens=records.tokens,
        trained=records.trained,
        lengths=records.lengths,
        counts=np.asarray([records.read, records.skipped, records.truncated]),
    )
    return buffer.getvalue()
