"""Samples made of whole documents, GPT-NeoX's `pack_impl` other than packed: `unpacked` (one document a
sample) and `pack_until_overflow` (documents joined until the next would overflow the window)."""

from __future__ import annotations

import bisect

import numpy as np
import torch
from torch.utils.data import Dataset

from .errors import DataError
from .gpt_dataset import beyond_vocabulary, check_label_ids, check_labels, epoch_seed
from .indexed import IndexedDataset
from .samples import SampleFormat

PACKINGS = ("packed", "pack_until_overflow", "unpacked")
"""GPT-NeoX's pack_impl values; packed is GPTDataset's stream cut across documents."""


class WholeDocumentDataset(Dataset):
    """Samples that start at a document's start and hold whole documents, as GPT-NeoX's gpt2_dataset.py
    builds them for pack_impl `unpacked` and `pack_until_overflow`:

    - unpacked: each document is a sample, in document order; the samples of an epoch are shuffled.
    - pack_until_overflow: the documents, shuffled, are joined into a sample while they fit in the window
      (seq_length + 1 tokens); the one that would overflow starts the next sample.

    A document longer than the window is cut to it (`allow_chopped`) or left out; with a label file, a
    document whose window holds no trained label is left out (as in NeoX). A short sample is padded with
    labels nothing is trained on. Where NeoX differs, nxd does what the modes mean:
    - NeoX appends the next document's first token as the last label (it reads one token past the
      sample's documents); nxd's samples hold their own documents only.
    - NeoX trains on its padding (token 0) when there is no label file, and its unpacked mode needs one
      (it reads label data unconditionally); nxd trains on neither padding nor pads, with or without.
    - NeoX numbers documents from the start of the file whatever the split; nxd reads the split's own.
    - NeoX packs one stream over all its samples, reshuffling the documents after each pass and
      shuffling all samples together; nxd builds an epoch at a time (below).

    An epoch is one pass over the documents with its own shuffles (`epoch_seed`), so sample k is the
    same whatever `num_samples` asks for; `num_samples` None means one epoch."""

    def __init__(
        self,
        indexed: IndexedDataset,
        name: str,
        documents: tuple[int, int],
        num_samples: int | None,
        format: SampleFormat,
        seed: int,
        packing: str,
        allow_chopped: bool = True,
        labels: IndexedDataset | None = None,
    ):
        if packing not in PACKINGS[1:]:  # packed samples are GPTDataset's
            raise DataError(f"data.pack_impl: expected one of {', '.join(PACKINGS[1:])}, found {packing!r}")
        if labels is not None:
            check_labels(indexed, labels)
        self.indexed, self.name, self.format, self.seed = indexed, name, format, seed
        self.packing, self.labels = packing, labels
        window = format.window
        numbers = np.arange(*documents, dtype=np.int64)
        sizes = indexed.sizes[numbers].astype(np.int64)
        usable = sizes > 0
        if not allow_chopped:
            usable &= sizes <= window
        if labels is not None:  # a sample trains the labels of positions 1 .. length - 1 of its window
            usable &= np.array(
                [
                    s > 1 and bool((labels.get(int(n), 1, min(int(s), window) - 1) >= 0).any())
                    for n, s in zip(numbers, sizes, strict=True)
                ],
                dtype=bool,
            )
        self.documents, self.sizes = numbers[usable], np.minimum(sizes[usable], window)
        if len(self.documents) == 0:
            cut = "" if allow_chopped else f" of at most seq_length + 1 = {window} tokens (allow_chopped: false)"
            raise DataError(
                f"{indexed.prefix}: the {name} split holds no document{cut} with tokens to train on "
                f"(pack_impl {packing})"
            )
        self._epochs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # documents, sample starts, shuffle
        self._ends = [0]  # samples before each epoch
        self.num_samples = self._add_epoch() if num_samples is None else num_samples
        while self._ends[-1] < self.num_samples:
            self._add_epoch()

    def _add_epoch(self) -> int:
        """Builds the next epoch: its documents in order, where each sample starts among them, and the
        order its samples are read in; returns how many samples it holds."""
        rng = np.random.RandomState(epoch_seed(self.seed, len(self._epochs)))
        count = len(self.documents)
        if self.packing == "unpacked":
            order, starts = np.arange(count), np.arange(count + 1)
        else:
            order = rng.permutation(count)
            boundaries, filled = [0], 0
            for position, size in enumerate(self.sizes[order].tolist()):
                if filled and filled + size > self.format.window:
                    boundaries.append(position)
                    filled = 0
                filled += size
            starts = np.array([*boundaries, count])
        samples = len(starts) - 1
        self._epochs.append((order, starts, rng.permutation(samples)))
        self._ends.append(self._ends[-1] + samples)
        return samples

    def __len__(self) -> int:
        return self.num_samples

    def sample_documents(self, index: int) -> list[int]:
        """The document numbers sample `index` holds, in order."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} of a {self.name} dataset of {self.num_samples}")
        epoch = bisect.bisect_right(self._ends, index) - 1
        order, starts, shuffle = self._epochs[epoch]
        number = int(shuffle[index - self._ends[epoch]])
        return [int(self.documents[i]) for i in order[starts[number] : starts[number + 1]]]

    def _window(self, documents: list[int], source: IndexedDataset) -> np.ndarray:
        return np.concatenate([source.get(document) for document in documents])[: self.format.window]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        documents = self.sample_documents(index)
        tokens = self._window(documents, self.indexed)
        vocab = self.format.vocab_size
        if vocab is not None and len(tokens) and int(tokens.max()) >= vocab:
            raise DataError(beyond_vocabulary(self.indexed, documents, vocab, f"sample {index}"))
        labels = None if self.labels is None else self._window(documents, self.labels)
        if vocab is not None and labels is not None:
            check_label_ids(self.labels, labels, vocab, f"sample {index}")
        return self.format.sample(tokens, labels)
