"""Megatron's GPT pretraining dataset over an indexed dataset, and the split of its documents."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .errors import DataError
from .indexed import IndexedDataset
from .indices import IndexSpec, cached_indices
from .samples import SampleFormat


def split_documents(splits_string: str, count: int) -> list[tuple[int, int]]:
    """[start, stop) document ranges of train, validation and test: Megatron's
    get_train_valid_test_split_ (proportions rounded, the rounding error taken off the last)."""
    weights = [float(part) for part in splits_string.replace("/", ",").split(",")][:3]
    weights += [0.0] * (3 - len(weights))
    total = sum(weights)
    bounds = [0]
    for weight in weights:
        bounds.append(bounds[-1] + int(round(weight / total * float(count))))
    excess = bounds[-1] - count
    bounds = [bounds[0]] + [bound - excess for bound in bounds[1:]]
    return [(bounds[i], bounds[i + 1]) for i in range(3)]


class GPTDataset(Dataset):
    """Samples of `format.window` tokens cut across documents `documents` of an indexed dataset, in
    the order of Megatron's shuffle index. `num_samples` None means one epoch (every token once)."""

    def __init__(self, indexed: IndexedDataset, name: str, documents: tuple[int, int], num_samples: int | None,
                 format: SampleFormat, seed: int, cache_dir: Path | None = None):  # fmt: skip
        self.indexed, self.format, self.name = indexed, format, name
        extra = int(format.plus_one)
        sequence_numbers = np.arange(*documents, dtype=np.int64)
        tokens = int(indexed.sizes[sequence_numbers].sum(dtype=np.int64))
        self.samples_per_epoch = (tokens - extra) // format.seq_length
        if self.samples_per_epoch < 1:
            raise DataError(
                f"{indexed.prefix}: the {name} split holds {tokens} tokens in {len(sequence_numbers)} documents; "
                f"expected at least seq_length + {extra} = {format.seq_length + extra}"
            )
        self.num_samples = self.samples_per_epoch if num_samples is None else num_samples
        spec = IndexSpec(name=f"{Path(indexed.prefix).name}-{name}", sizes_digest=indexed.sizes_digest,
                         first_document=documents[0], documents=len(sequence_numbers), num_samples=self.num_samples,
                         seq_length=format.seq_length, seed=seed, add_extra_token=extra)  # fmt: skip
        directory = cache_dir if cache_dir is not None else Path(indexed.prefix).parent / "index-cache"
        indices = cached_indices(spec, directory, indexed.sizes, sequence_numbers)
        self.doc_idx, self.sample_idx, self.shuffle_idx = indices.doc_idx, indices.sample_idx, indices.shuffle_idx

    def __len__(self) -> int:
        return self.num_samples

    def tokens(self, index: int) -> np.ndarray:
        """The window of sample `index` (after shuffling), as Megatron's GPTDataset reads it."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} of a {self.name} dataset of {self.num_samples}")
        position = int(self.shuffle_idx[index])
        (first, first_offset), (last, last_offset) = self.sample_idx[position], self.sample_idx[position + 1]
        extra = int(self.format.plus_one)
        if first == last:
            return self.indexed.get(
                int(self.doc_idx[first]), int(first_offset), int(last_offset - first_offset) + extra
            )
        parts = [self.indexed.get(int(self.doc_idx[first]), int(first_offset))]
        parts += [self.indexed.get(int(self.doc_idx[i])) for i in range(first + 1, last)]
        parts.append(self.indexed.get(int(self.doc_idx[last]), 0, int(last_offset) + extra))
        return np.concatenate(parts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens = self.tokens(index)
        vocab = self.format.vocab_size
        if vocab is not None and len(tokens) and int(tokens.max()) >= vocab:
            raise DataError(self._beyond_vocabulary(index, vocab))
        return self.format.sample(tokens)

    def _beyond_vocabulary(self, index: int, vocab: int) -> str:
        """Which stored document of sample `index` holds an id at or beyond `vocab`, said plainly."""
        position = int(self.shuffle_idx[index])
        first, last = int(self.sample_idx[position][0]), int(self.sample_idx[position + 1][0])
        for document in (int(self.doc_idx[i]) for i in range(first, last + 1)):
            stored = self.indexed.get(document)
            if len(stored) and (found := int(stored.max())) >= vocab:
                return (f"{self.indexed.bin_path}: document {document} holds token id {found}, beyond the vocabulary "
                        f"of {vocab} ids the tokenizer has (expected ids below {vocab}: tokenized with another "
                        "tokenizer?)")  # fmt: skip
        return f"{self.indexed.bin_path}: sample {index} holds a token id at or beyond the vocabulary of {vocab} ids"
