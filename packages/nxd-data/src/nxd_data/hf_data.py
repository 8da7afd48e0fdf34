"""Hugging Face data for pretraining: a `datasets.save_to_disk` folder, or jsonl, arrow or parquet
files, either pre-tokenised (an `input_ids` column, one sample per row) or text (a `text` column,
tokenised, documents joined by the end-of-document token and cut into samples as Megatron does)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import datasets
import numpy as np
import pyarrow.compute as pc
import torch
from filelock import FileLock
from torch.utils.data import Dataset

from .errors import DataError
from .files import save_atomically
from .indexed import token_dtype
from .samples import SampleFormat
from .tokenizer import TextTokenizer

READERS = {".jsonl": datasets.Dataset.from_json, ".json": datasets.Dataset.from_json,
           ".parquet": datasets.Dataset.from_parquet, ".arrow": datasets.Dataset.from_file}  # fmt: skip
SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


def load_records(location: str, where: str, split: str, limit: int | None = None) -> datasets.Dataset:
    """The records at `location` (only the first `limit` when given); `split` picks one split of a
    saved DatasetDict that holds several."""
    path = Path(location)
    kinds = ", ".join(READERS)
    if path.is_dir() and any((path / marker).exists() for marker in SAVED_MARKERS):
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded and len(loaded) != 1:
                raise DataError(f"{where}: {location} holds splits {', '.join(loaded)}; expected one named {split!r}")
            loaded = loaded[split] if split in loaded else next(iter(loaded.values()))
    elif path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in READERS)
        if not files or len({".json" if p.suffix == ".jsonl" else p.suffix for p in files}) > 1:
            raise DataError(f"{where}: {location} is neither a datasets.save_to_disk folder nor a folder of "
                            f"files of one kind ({kinds})")  # fmt: skip
        loaded = _read([str(p) for p in files], files[0].suffix, where)
    elif path.is_file() and path.suffix in READERS:
        loaded = _read(str(path), path.suffix, where)
    else:
        found = "no such file or directory" if not path.exists() else f"a {path.suffix or 'suffix-less'} file"
        raise DataError(
            f"{where}: expected a datasets.save_to_disk folder or a {kinds} file, found {found}: {location}"
        )
    if limit is not None:
        loaded = loaded.select(range(min(limit, len(loaded))))
    if len(loaded) == 0:
        raise DataError(f"{where}: {location} holds no records")
    return loaded


def _read(files: str | list[str], suffix: str, where: str) -> datasets.Dataset:
    try:
        if suffix == ".arrow" and isinstance(files, list):
            return datasets.concatenate_datasets([datasets.Dataset.from_file(f) for f in files])
        return READERS[suffix](files)
    except Exception as error:  # datasets wraps parser errors in several types
        raise DataError(f"{where}: cannot read {files} as {suffix[1:]}: {error}") from None


class TokenRows(Dataset):
    """One sample per pre-tokenised row (rows shorter than a window are padded, labels ignored)."""

    def __init__(self, records: datasets.Dataset, format: SampleFormat, where: str):
        lengths = pc.list_value_length(records.data.column("input_ids")).to_numpy(zero_copy_only=False)
        too_long = np.flatnonzero(lengths > format.window)
        if too_long.size:
            raise DataError(f"{where}: row {too_long[0]} has {lengths[too_long[0]]} input_ids; expected at most "
                            f"{format.window} (seq_length{' + 1' if format.plus_one else ''}); pack the data to "
                            "the sequence length or raise data.seq_length")  # fmt: skip
        self.records, self.format = records.with_format("numpy", columns=["input_ids"]), format

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.format.sample(self.records[int(index)]["input_ids"])


class TokenStream(Dataset):
    """Consecutive windows of a token stream, neighbours overlapping by the extra token."""

    def __init__(self, tokens: np.ndarray, format: SampleFormat):
        self.tokens, self.format = tokens, format

    def __len__(self) -> int:
        return (len(self.tokens) - int(self.format.plus_one)) // self.format.seq_length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = int(index) * self.format.seq_length
        return self.format.sample(self.tokens[start : start + self.format.window])


def tokenised_stream(records: datasets.Dataset, tokenizer: TextTokenizer, cache_dir: Path) -> np.ndarray:
    """The `text` column tokenised, each document followed by the end-of-document token (cached
    under the records' and tokenizer's fingerprints; the first process builds, the others wait)."""
    key = hashlib.sha256(f"{records._fingerprint}-{tokenizer.fingerprint}".encode()).hexdigest()[:16]
    path = cache_dir / f"hf-tokens-{key}.npy"
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):
        if not path.exists():
            pieces = []
            for batch in records.select_columns(["text"]).iter(batch_size=1024):
                pieces += [
                    np.asarray(ids + [tokenizer.eod_id], dtype=np.int64) for ids in tokenizer.encode(batch["text"])
                ]
            save_atomically(path, np.concatenate(pieces).astype(token_dtype(tokenizer.vocab_size)))
    return np.load(path, mmap_mode="r")


def hf_pretraining_dataset(
    location: str,
    where: str,
    split: str,
    format: SampleFormat,
    tokenizer: TextTokenizer | None,
    cache_dir: Path,
    limit: int | None = None,
) -> Dataset:
    """The samples of the Hugging Face data at `location` (see the module docstring)."""
    records = load_records(location, where, split, limit)
    if "input_ids" in records.column_names:
        return TokenRows(records, format, f"{where} ({location})")
    if "text" not in records.column_names:
        raise DataError(f"{where}: {location} has columns {', '.join(records.column_names)}; expected input_ids "
                        "(pre-tokenised) or text")  # fmt: skip
    if tokenizer is None:
        raise DataError(f"{where}: {location} holds text; expected data.tokenizer to tokenise it")
    stream = TokenStream(tokenised_stream(records, tokenizer, cache_dir), format)
    if len(stream) == 0:
        raise DataError(f"{where}: {location} tokenises to fewer than seq_length + 1 tokens")
    return stream
