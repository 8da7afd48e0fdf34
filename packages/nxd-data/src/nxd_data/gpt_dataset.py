"""Megatron's GPT pretraining dataset over an indexed dataset, and the split of its documents."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .errors import DataError
from .indexed import IndexedDataset
from .indices import IndexSpec, Indices, cached_indices
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


OPEN_EPOCHS = 8
"""Epochs whose indices a dataset keeps memory-mapped at once (the sample stream moves through them in order)."""


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of epoch `epoch`'s shuffles: `seed` itself for the first (Megatron's draws for a one-epoch
    run), an independent stream of it for the others."""
    return seed if epoch == 0 else int(np.random.SeedSequence((seed, epoch)).generate_state(1)[0])


def check_labels(data: IndexedDataset, labels: IndexedDataset) -> None:
    """A DataError naming both files and the first document that differs unless `labels` holds a label for
    every token of `data`: the same documents of the same lengths."""
    if len(labels) != len(data):
        raise DataError(
            f"{labels.index_path}: holds {len(labels)} documents; expected the {len(data)} of its data "
            f"file {data.index_path} (a label for every token)"
        )
    if (differ := np.flatnonzero(labels.sizes != data.sizes)).size:
        at = int(differ[0])
        raise DataError(
            f"{labels.index_path}: document {at} holds {int(labels.sizes[at])} labels; its data file "
            f"{data.index_path} holds {int(data.sizes[at])} tokens there (expected a label for every "
            "token)"
        )


class GPTDataset(Dataset):
    """Samples of `format.window` tokens cut across documents `documents` of an indexed dataset, epoch
    after epoch. Each epoch has its own indices: its documents shuffled, cut into samples and the
    samples shuffled, as Megatron's indices for one epoch (the first epoch's are Megatron's own with
    this seed). Sample k is therefore the same whatever `num_samples` asks for, so a longer run (a
    raised max_steps) continues the stream a shorter one read. Megatron builds all epochs of a run
    as one stream instead, whose order depends on the run's length; an epoch's leftover tokens (fewer
    than a sample) are not used here. `num_samples` None means one epoch (every token once)."""

    def __init__(
        self,
        indexed: IndexedDataset,
        name: str,
        documents: tuple[int, int],
        num_samples: int | None,
        format: SampleFormat,
        seed: int,
        cache_dir: Path | None = None,
        labels: IndexedDataset | None = None,
    ):
        """`labels`: a label file of the same documents, read over the same spans for the labels."""
        self.indexed, self.format, self.name, self.seed = indexed, format, name, seed
        if labels is not None:
            check_labels(indexed, labels)
        self.labels = labels
        extra = int(format.plus_one)
        self.sequence_numbers = np.arange(*documents, dtype=np.int64)
        tokens = int(indexed.sizes[self.sequence_numbers].sum(dtype=np.int64))
        self.samples_per_epoch = (tokens - extra) // format.seq_length
        if self.samples_per_epoch < 1:
            raise DataError(
                f"{indexed.prefix}: the {name} split holds {tokens} tokens in {len(self.sequence_numbers)} "
                f"documents; expected at least seq_length + {extra} = {format.seq_length + extra}"
            )
        self.num_samples = self.samples_per_epoch if num_samples is None else num_samples
        self.first_document = documents[0]
        self.cache_dir = cache_dir if cache_dir is not None else Path(indexed.prefix).parent / "index-cache"
        self._open: dict[int, Indices] = {}
        for epoch in range(-(-self.num_samples // self.samples_per_epoch)):  # built now, not mid-run
            self.indices(epoch)

    def spec(self, epoch: int) -> IndexSpec:
        return IndexSpec(
            name=f"{Path(self.indexed.prefix).name}-{self.name}",
            sizes_digest=self.indexed.sizes_digest,
            first_document=self.first_document,
            documents=len(self.sequence_numbers),
            num_samples=self.samples_per_epoch,
            seq_length=self.format.seq_length,
            seed=epoch_seed(self.seed, epoch),
            add_extra_token=int(self.format.plus_one),
            epoch=epoch,
        )

    def indices(self, epoch: int) -> Indices:
        """Epoch `epoch`'s doc, sample and shuffle indices (built and cached on first use)."""
        if (found := self._open.get(epoch)) is None:
            found = cached_indices(self.spec(epoch), self.cache_dir, self.indexed.sizes, self.sequence_numbers)
            self._open[epoch] = found
            while len(self._open) > OPEN_EPOCHS:
                del self._open[next(iter(self._open))]
        return found

    def __len__(self) -> int:
        return self.num_samples

    def _locate(self, index: int) -> tuple[Indices, int]:
        """Sample `index`'s epoch indices and its position in that epoch's sample index."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} of a {self.name} dataset of {self.num_samples}")
        epoch, number = divmod(index, self.samples_per_epoch)
        indices = self.indices(epoch)
        return indices, int(indices.shuffle_idx[number])

    def tokens(self, index: int, source: IndexedDataset | None = None) -> np.ndarray:
        """The window of sample `index` (after shuffling), as Megatron's GPTDataset reads it; from `source`
        (the label file) instead of the data when given."""
        source = self.indexed if source is None else source
        indices, position = self._locate(index)
        doc_idx = indices.doc_idx
        (first, first_offset), (last, last_offset) = indices.sample_idx[position], indices.sample_idx[position + 1]
        extra = int(self.format.plus_one)
        if first == last:
            return source.get(int(doc_idx[first]), int(first_offset), int(last_offset - first_offset) + extra)
        parts = [source.get(int(doc_idx[first]), int(first_offset))]
        parts += [source.get(int(doc_idx[i])) for i in range(first + 1, last)]
        parts.append(source.get(int(doc_idx[last]), 0, int(last_offset) + extra))
        return np.concatenate(parts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens = self.tokens(index)
        vocab = self.format.vocab_size
        if vocab is not None and len(tokens) and int(tokens.max()) >= vocab:
            raise DataError(self._beyond_vocabulary(index, vocab))
        labels = None if self.labels is None else self.tokens(index, self.labels)
        if vocab is not None and labels is not None:
            check_label_ids(self.labels, labels, vocab, f"sample {index}")
        return self.format.sample(tokens, labels)

    def _beyond_vocabulary(self, index: int, vocab: int) -> str:
        """Which stored document of sample `index` holds an id at or beyond `vocab`, said plainly."""
        indices, position = self._locate(index)
        first, last = int(indices.sample_idx[position][0]), int(indices.sample_idx[position + 1][0])
        documents = [int(indices.doc_idx[i]) for i in range(first, last + 1)]
        return beyond_vocabulary(self.indexed, documents, vocab, f"sample {index}")


def check_label_ids(labels: IndexedDataset, window: np.ndarray, vocab: int, sample: str) -> None:
    """A DataError unless every label of `window` (read from the label file `labels`) is below `vocab`."""
    if len(window) and (found := int(window.max())) >= vocab:
        raise DataError(
            f"{labels.bin_path}: {sample} holds label {found}, beyond the vocabulary of {vocab} ids "
            "(expected token ids, or a negative label where nothing is trained)"
        )


def beyond_vocabulary(indexed: IndexedDataset, documents: list[int], vocab: int, sample: str) -> str:
    """Which of `documents` (those `sample` reads) holds an id at or beyond `vocab`, said plainly."""
    for document in documents:
        stored = indexed.get(document)
        if len(stored) and (found := int(stored.max())) >= vocab:
            return (
                f"{indexed.bin_path}: document {document} holds token id {found}, beyond the vocabulary of "
                f"{vocab} ids the tokenizer has (expected ids below {vocab}: tokenized with another "
                "tokenizer?)"
            )
    return f"{indexed.bin_path}: {sample} holds a token id at or beyond the vocabulary of {vocab} ids"
