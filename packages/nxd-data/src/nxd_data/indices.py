"""The document, sample and shuffle indices of Megatron's GPT dataset, built with numpy and cached.

A split's documents are repeated for as many epochs as the requested samples need; each epoch's
documents are shuffled (`doc_idx`). Laid end to end they form one token stream, cut into samples of
seq_length (+1) tokens that overlap by the one extra token (`sample_idx`: where each sample starts,
as (position in doc_idx, offset in that document)). `shuffle_idx` permutes the samples; when the
last epoch is used for less than 80% of its samples it is shuffled apart from the others, so the
partial epoch does not crowd out whole ones. This is Megatron-LM's `_build_index_mappings` and
`helpers.build_sample_idx`, with the same random draws, so the same data, seed and lengths give
the same samples as Megatron. `GPTDataset` asks for one epoch at a time (see there).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import xxhash
from filelock import FileLock

from .errors import DataWarning
from .files import save_atomically


@dataclass(frozen=True)
class IndexSpec:
    """Everything that defines the indices (its digest names the cache files)."""

    name: str
    sizes_digest: str
    first_document: int
    documents: int
    num_samples: int
    seq_length: int
    seed: int
    add_extra_token: int
    epoch: int = 0

    def digest(self) -> str:
        return hashlib.md5(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Indices:
    doc_idx: np.ndarray
    sample_idx: np.ndarray
    shuffle_idx: np.ndarray


def num_epochs(tokens_per_epoch: int, seq_length: int, num_samples: int, add_extra_token: int = 1) -> int:
    """The fewest epochs whose tokens give `num_samples` samples (an epoch must hold one sample):
    the least e with (e * tokens - extra) // seq >= num_samples, i.e. e * tokens >= num_samples * seq
    + extra (counted, not searched, so a huge request costs nothing here)."""
    return max(1, -(-(num_samples * seq_length + add_extra_token) // tokens_per_epoch))


def build_doc_idx(
    documents: np.ndarray, epochs: int, rng: np.random.RandomState, separate_last_epoch: bool
) -> np.ndarray:
    """The documents repeated `epochs` times, shuffled (the last epoch apart when asked)."""
    if not separate_last_epoch or epochs == 1:
        doc_idx = np.tile(documents, epochs).astype(np.int32)
        rng.shuffle(doc_idx)
        return doc_idx
    first = build_doc_idx(documents, epochs - 1, rng, False)
    last = build_doc_idx(documents, 1, rng, False)
    return np.concatenate((first, last))


def build_sample_idx(
    sizes: np.ndarray, doc_idx: np.ndarray, seq_length: int, num_samples: int, add_extra_token: int = 1
) -> np.ndarray:
    """(position in doc_idx, offset) where each of the `num_samples` samples starts, plus the end of
    the last: entry k locates token k * seq_length + add_extra_token - 1 of the stream (the last token
    of sample k - 1; offsets past the end of a document when add_extra_token is 0)."""
    lengths = sizes[doc_idx].astype(np.int64)
    ends = np.cumsum(lengths)
    boundary = np.arange(1, num_samples + 1, dtype=np.int64) * seq_length + add_extra_token - 1
    which = np.searchsorted(ends, boundary, side="right")
    offsets = boundary - (ends[which] - lengths[which]) + 1 - add_extra_token
    dtype = np.int32 if max(len(doc_idx), int(lengths.max(initial=0))) < np.iinfo(np.int32).max else np.int64
    sample_idx = np.zeros((num_samples + 1, 2), dtype=dtype)
    sample_idx[1:, 0], sample_idx[1:, 1] = which, offsets
    return sample_idx


def build_shuffle_idx(num_samples: int, total: int, rng: np.random.RandomState) -> np.ndarray:
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total:
        return first
    last = np.arange(num_samples, total, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


def build_indices(
    sizes: np.ndarray, documents: np.ndarray, num_samples: int, seq_length: int, seed: int, add_extra_token: int = 1
) -> Indices:
    """Megatron's three indices for `num_samples` samples of the `documents` (sequence numbers)."""
    tokens_per_epoch = int(sizes[documents].sum(dtype=np.int64))
    epochs = num_epochs(tokens_per_epoch, seq_length, num_samples, add_extra_token)
    rng = np.random.RandomState(seed=seed)
    separate_last_epoch = False
    if epochs > 1:
        from_epochs_minus_one = ((epochs - 1) * tokens_per_epoch - add_extra_token) // seq_length
        last_epoch_samples = num_samples - from_epochs_minus_one
        samples_per_epoch = (tokens_per_epoch - add_extra_token) // seq_length
        separate_last_epoch = last_epoch_samples < int(0.80 * samples_per_epoch)
    doc_idx = build_doc_idx(documents, epochs, rng, separate_last_epoch)
    total = (epochs * tokens_per_epoch - add_extra_token) // seq_length
    sample_idx = build_sample_idx(sizes, doc_idx, seq_length, total, add_extra_token)
    shuffled = from_epochs_minus_one if separate_last_epoch else total
    return Indices(doc_idx, sample_idx, build_shuffle_idx(shuffled, total, rng))


def cached_indices(spec: IndexSpec, cache_dir: Path, sizes: np.ndarray, documents: np.ndarray) -> Indices:
    """The indices `spec` defines, memory-mapped from `cache_dir`; the first process to need them
    builds them while the others wait on a file lock, and files appear only once complete. The marker
    records each file's size and XXH3-64; cached files that differ (truncated, overwritten, damaged)
    are built again, with a warning."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    stem = cache_dir / f"{spec.name}-{spec.digest()}"
    marker = stem.with_suffix(".json")
    files = {field: Path(f"{stem}.{field}.npy") for field in INDEX_FIELDS}
    with FileLock(f"{stem}.lock"):
        if marker.exists() and (problem := _cache_problem(marker, files)) is not None:
            warnings.warn(f"{problem}; building the indices again", DataWarning, stacklevel=2)
            marker.unlink()
        if not marker.exists():
            built = build_indices(sizes, documents, spec.num_samples, spec.seq_length, spec.seed, spec.add_extra_token)
            for field, path in files.items():
                save_atomically(path, getattr(built, field))
            record = {
                **asdict(spec),
                "files": {field: [path.stat().st_size, _digest(path)] for field, path in files.items()},
            }
            save_atomically(marker, json.dumps(record, indent=1).encode())
    return Indices(*(np.load(files[field], mmap_mode="r") for field in INDEX_FIELDS))


INDEX_FIELDS = ("doc_idx", "sample_idx", "shuffle_idx")


def _digest(path: Path) -> str:
    digest = xxhash.xxh3_64()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _cache_problem(marker: Path, files: dict[str, Path]) -> str | None:
    """Why the cached index files differ from what their marker recorded, or None when they match."""
    try:
        recorded = json.loads(marker.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{marker}: unreadable or from an older nxd (no file digests)"
    for field, path in files.items():
        size, digest = recorded.get(field, (None, None))
        if not path.is_file():
            return f"{path}: missing from the index cache"
        if path.stat().st_size != size or _digest(path) != digest:
            return f"{path}: differs from the index its marker recorded (truncated or overwritten)"
    return None
