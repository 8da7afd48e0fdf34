"""Hugging Face data for pretraining: a `datasets.save_to_disk` folder, or jsonl, arrow or parquet
files, either pre-tokenised (an `input_ids` column, one sample per row) or text (a `text` column,
tokenised, documents joined by the end-of-document token and cut into samples as Megatron does).

Pre-tokenised rows may carry `labels` (transformers' convention: unshifted, -100 where no loss is
taken) and `attention_mask` (0 on padding), as NxDT's Hugging Face datasets do; position t then
learns labels[t + 1], and nothing where the mask or the label says so."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from filelock import FileLock
from torch.utils.data import Dataset

from .errors import DataError
from .files import save_atomically
from .indexed import token_dtype
from .samples import IGNORE_INDEX, SampleFormat
from .tokenizer import TextTokenizer

if TYPE_CHECKING:  # datasets and pyarrow load when Hugging Face data is read, not with nxd_data
    import datasets
    import pyarrow as pa

READERS = {".jsonl": "from_json", ".json": "from_json", ".parquet": "from_parquet", ".arrow": "from_file"}
"""File suffix -> the `datasets.Dataset` constructor that reads it."""
SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


def hf_datasets(where: str) -> Any:
    """The datasets package, or a DataError naming `where` and the extra that installs it."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{where}: Hugging Face data is read with the datasets package, which is not installed; "
            "install nxd-data[hf] (pip install 'nxd-data[hf]')"
        ) from None
    return datasets


def load_records(location: str, where: str, split: str, limit: int | None = None) -> datasets.Dataset:
    """The records at `location` (only the first `limit` when given); `split` picks one split of a
    saved DatasetDict that holds several."""
    datasets = hf_datasets(where)

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
            raise DataError(
                f"{where}: {location} is neither a datasets.save_to_disk folder nor a folder of "
                f"files of one kind ({kinds})"
            )
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
    datasets = hf_datasets(where)

    try:
        if suffix == ".arrow" and isinstance(files, list):
            return datasets.concatenate_datasets([datasets.Dataset.from_file(f) for f in files])
        return getattr(datasets.Dataset, READERS[suffix])(files)
    except Exception as error:  # datasets wraps parser errors in several types
        raise DataError(f"{where}: cannot read {files} as {suffix[1:]}: {error}") from None


class TokenRows(Dataset):
    """One sample per pre-tokenised row (rows shorter than a window are padded, labels ignored); ids
    are checked against `vocab_size` when it is given."""

    def __init__(self, records: datasets.Dataset, format: SampleFormat, where: str, vocab_size: int | None = None):
        import pyarrow.compute as pc

        ids = records.data.column("input_ids")
        lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False)
        too_long = np.flatnonzero(lengths > format.window)
        if too_long.size:
            raise DataError(
                f"{where}: row {too_long[0]} has {lengths[too_long[0]]} input_ids; expected at most "
                f"{format.window} (seq_length{' + 1' if format.plus_one else ''}); pack the data to "
                "the sequence length or raise data.seq_length"
            )
        if vocab_size is not None:
            _check_ids(ids, lengths, vocab_size, where)
        columns = [name for name in ("input_ids", "labels", "attention_mask") if name in records.column_names]
        self.records, self.format = records.with_format("numpy", columns=columns), format

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = self.records[int(index)]
        sample = self.format.sample(row["input_ids"])
        length = min(len(row["input_ids"]), self.format.window)
        targets = sample["labels"]
        if "labels" in row:  # position t learns the given label of t + 1
            given = torch.as_tensor(np.asarray(row["labels"][1:length], dtype=np.int64))
            targets[: len(given)] = given
        if "attention_mask" in row:
            masked = torch.as_tensor(np.asarray(row["attention_mask"][1:length]) == 0)
            targets[: len(masked)][masked] = IGNORE_INDEX
        if self.format.eod_mask_loss:
            targets[targets == self.format.eod_id] = IGNORE_INDEX
        return sample


def _check_ids(ids: pa.ChunkedArray, lengths: np.ndarray, vocab_size: int, where: str) -> None:
    """Every id in [0, vocab_size): an id the embedding lacks would fail (or read another row) deep in
    the first step."""
    import pyarrow.compute as pc

    flat = pc.list_flatten(ids)
    if len(flat) == 0:
        return
    low, high = pc.min_max(flat).values()
    if low.as_py() < 0 or high.as_py() >= vocab_size:
        bad = pc.or_(pc.less(flat, 0), pc.greater_equal(flat, vocab_size))
        position = pc.index(bad, True).as_py()
        row = int(np.searchsorted(np.cumsum(lengths), position, side="right"))
        raise DataError(
            f"{where}: row {row} holds token id {flat[position].as_py()}; expected ids in [0, "
            f"{vocab_size}) (the model's vocabulary)"
        )


def _check_column(records: datasets.Dataset, name: str, where: str) -> None:
    """Column `name` holds what a sample is made of in every row (a list of integers for input_ids, a
    string for text): a row that lacks it or holds another type is named here, not deep in a worker."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = records.data.column(name)
    kind = column.type
    if name == "text":
        fits = pa.types.is_string(kind) or pa.types.is_large_string(kind)
        expected = "a string"
    else:
        fits = (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(kind.value_type)
        expected = "a list of integer token ids"
    if not fits:
        raise DataError(f"{where}: column {name} holds {kind}; expected {expected} in every row")
    if column.null_count:
        row = pc.index(pc.is_null(column), True).as_py()
        raise DataError(f"{where}: row {row} has no {name}; expected {expected} in every row")
    if name == "text":
        try:
            column.validate(full=True)
        except pa.ArrowInvalid:
            row = next(row for row, value in enumerate(column) if not _decodes(value))
            raise DataError(f"{where}: row {row}: its text is not valid UTF-8") from None


def _decodes(value: pa.Scalar) -> bool:
    try:
        value.as_py()
    except UnicodeDecodeError:
        return False
    return True


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
    vocab_size: int | None = None,
) -> Dataset:
    """The samples of the Hugging Face data at `location` (see the module docstring); pre-tokenised ids
    are checked against `vocab_size` (default: the tokenizer's)."""
    records = load_records(location, where, split, limit)
    if "input_ids" in records.column_names:
        _check_column(records, "input_ids", f"{where} ({location})")
        vocab_size = vocab_size if vocab_size is not None or tokenizer is None else tokenizer.vocab_size
        return TokenRows(records, format, f"{where} ({location})", vocab_size)
    if "text" not in records.column_names:
        raise DataError(
            f"{where}: {location} has columns {', '.join(records.column_names)}; expected input_ids "
            "(pre-tokenised) or text"
        )
    if tokenizer is None:
        raise DataError(f"{where}: {location} holds text; expected data.tokenizer to tokenise it")
    _check_column(records, "text", f"{where} ({location})")
    stream = TokenStream(tokenised_stream(records, tokenizer, cache_dir), format)
    if len(stream) == 0:
        raise DataError(f"{where}: {location} tokenises to fewer than seq_length + 1 tokens")
    return stream
