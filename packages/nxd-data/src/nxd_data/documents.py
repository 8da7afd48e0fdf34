"""Post-training data as pre-tokenised indexed documents (GPT-NeoX's post-training files, as its
`preprocess_data_with_chat_template.py` writes them): preference pairs from aligned chosen and
rejected files, KTO examples from one file with a reward document each; each with optional label files
and precomputed reference log-probs.

A document of n tokens t with labels l (a label file of the same documents, -100 where nothing is
trained) becomes one row: the inputs t[:seq_length], position j trained on l[j + 1] (GPT-NeoX's shift);
without a label file every next token of the document is trained. A document longer than seq_length + 1
tokens is cut to them (`allow_chopped`) or left out, as is one with nothing to train on in its window
(the labels l[1 : seq_length + 1] that a row trains on; NeoX looks at l[:seq_length], which differs only
for a document whose one label is its first token or falls just past the window); a pair is left out
when either side is. A reference file (float, value j the reference model's log-prob of token j + 1, as
NeoX's precompute writes it: seq_length values a document, padding included, under NeoX's float32 code)
gives each row's reference log-prob, the sum over its trained positions. A reward document holds one
number (NeoX's `--binary-reward`: 1 or -1): its sign makes the example desirable or undesirable, and its
size scales KTO's beta.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from .errors import DataError
from .indexed import IndexedDataset
from .kto import LABEL_KEY
from .samples import IGNORE_INDEX

REFERENCE_KEY = "reference_log_probs"
REWARD_KEY = "kto_reward"
"""A KTO row's reward: its sign says desirable (> 0) or undesirable (< 0), its size scales beta."""
NEUTRAL = 0.001
"""Rewards within this of 0 are neither desirable nor undesirable (GPT-NeoX's threshold): such an
example adds nothing to the loss but still counts in its half's KL estimate."""


@dataclass(frozen=True)
class DocumentFiles:
    """One side of the data: a token file and its optional label and reference files (prefixes),
    with the config key each was given under (named in errors) and the indexed format expected
    (data.data_impl)."""

    tokens: str
    labels: str | None = None
    reference: str | None = None
    where: str = "data"
    impl: str = "infer"


def _open(prefix: str, where: str, impl: str) -> IndexedDataset:
    """The indexed dataset at `prefix`; a DataError names the config key it was given under."""
    try:
        return IndexedDataset(prefix, impl=impl)
    except DataError as error:
        raise DataError(f"{where}: {error}") from None


class _Side:
    """The opened files of one side, checked to hold the same documents."""

    def __init__(self, files: DocumentFiles, vocab_size: int | None, seq_length: int):
        self.files = files
        self.tokens = _open(files.tokens, files.where, files.impl)
        if vocab_size is not None and len(self.tokens.tokens):
            outside = (self.tokens.tokens < 0) | (self.tokens.tokens >= vocab_size)
            if outside.any():
                at = int(np.argmax(outside))
                starts = self.tokens.pointers // self.tokens.dtype.itemsize
                document = int(np.searchsorted(starts, at, side="right")) - 1
                raise DataError(
                    f"{files.where}: {files.tokens}: document {document} holds token id "
                    f"{int(self.tokens.tokens[at])}; expected ids from 0 to the tokenizer's vocabulary "
                    f"({vocab_size}): written with another tokenizer?"
                )
        self.labels = self._labels(files.labels)
        self.reference = self._reference(files.reference, seq_length)

    def _labels(self, prefix: str | None) -> IndexedDataset | None:
        if prefix is None:
            return None
        dataset = _open(prefix, self.files.where, self.files.impl)
        if len(dataset) != len(self.tokens):
            raise DataError(
                f"{self.files.where}: labels file {prefix}: expected {len(self.tokens)} documents (those "
                f"of {self.files.tokens}), found {len(dataset)}"
            )
        if bad := np.flatnonzero(dataset.sizes != self.tokens.sizes)[:1].tolist():
            raise DataError(
                f"{self.files.where}: labels file {prefix}: document {bad[0]} holds "
                f"{dataset.sizes[bad[0]]} values where {self.files.tokens} holds "
                f"{self.tokens.sizes[bad[0]]} tokens; expected one per token"
            )
        return dataset

    def _reference(self, prefix: str | None, seq_length: int) -> IndexedDataset | None:
        """A reference file: at least one document per token document (NeoX's precompute rounds the
        count up, wrapping round), each with a value for every position a row trains (NeoX writes
        seq_length a document, padding included)."""
        if prefix is None:
            return None
        dataset = _open(prefix, self.files.where, self.files.impl)
        if dataset.dtype.kind != "f":
            raise DataError(
                f"{self.files.where}: reference file {prefix}: expected float log-probs, found {dataset.dtype}"
            )
        if len(dataset) < len(self.tokens):
            raise DataError(
                f"{self.files.where}: reference file {prefix}: expected a document for each of the "
                f"{len(self.tokens)} of {self.files.tokens}, found {len(dataset)}"
            )
        needed = np.minimum(self.tokens.sizes.astype(np.int64), seq_length + 1) - 1
        if bad := np.flatnonzero(dataset.sizes[: len(self.tokens)] < needed)[:1].tolist():
            raise DataError(
                f"{self.files.where}: reference file {prefix}: document {bad[0]} holds "
                f"{dataset.sizes[bad[0]]} log-probs where its row has {needed[bad[0]]} positions; "
                "expected one per position (computed with a shorter seq_length?)"
            )
        return dataset

    def __len__(self) -> int:
        return len(self.tokens)

    def row(self, index: int, seq_length: int) -> tuple[np.ndarray, np.ndarray, float]:
        """The document's inputs, its labels per position (shifted) and its reference log-prob (0
        without a reference file)."""
        window = min(int(self.tokens.sizes[index]), seq_length + 1)
        tokens = self.tokens.get(index, 0, window).astype(np.int64)
        targets = tokens if self.labels is None else self.labels.get(index, 0, window).astype(np.int64)
        labels = np.where(targets[1:] >= 0, targets[1:], IGNORE_INDEX)
        reference = 0.0
        if self.reference is not None:
            values = self.reference.get(index, 0, len(labels)).astype(np.float64)
            reference = float(values[labels != IGNORE_INDEX].sum())
        return tokens[:seq_length], labels, reference

    def usable(self, seq_length: int, allow_chopped: bool) -> np.ndarray:
        """Which documents make a row: not too long (unless cut), something to train on in the window."""
        sizes = self.tokens.sizes.astype(np.int64)
        keep = sizes >= 2
        if not allow_chopped:
            keep &= sizes <= seq_length + 1
        if self.labels is not None:
            for index in np.flatnonzero(keep):
                window = min(int(sizes[index]), seq_length + 1)
                keep[index] = bool((self.labels.get(int(index), 1, window - 1) >= 0).any())
        return keep


def _fill(seq_length: int, pad_id: int, tokens: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    input_ids = np.full(seq_length, pad_id, dtype=np.int64)
    padded = np.full(seq_length, IGNORE_INDEX, dtype=np.int64)
    input_ids[: len(tokens)] = tokens
    padded[: len(labels)] = labels[:seq_length]
    return input_ids, padded


class _Documents(Dataset):
    """What pair and example data share: the usable documents, in file order, and the fingerprint."""

    sides: tuple[_Side, ...]
    kept: np.ndarray
    seq_length: int
    pad_id: int

    def __len__(self) -> int:
        return len(self.kept)

    @property
    def truncated(self) -> int:
        return int(sum((side.tokens.sizes[self.kept] > self.seq_length + 1).sum() for side in self.sides))

    def lengths(self) -> list[int]:
        """Each sample's longest row in tokens (how many columns it needs)."""
        sizes = np.max([side.tokens.sizes[self.kept] for side in self.sides], axis=0)
        return np.minimum(sizes, self.seq_length).astype(int).tolist()

    @functools.cached_property
    def fingerprint(self) -> str:
        """SHA-256 of every file's contents, the kept documents and the row length: equal exactly when
        the samples are."""
        digest = hashlib.sha256(f"{type(self).__name__} {self.seq_length} {self.pad_id}".encode())
        files = [dataset for side in self.sides for dataset in (side.tokens, side.labels, side.reference)]
        for dataset in [*files, getattr(self, "rewards", None)]:
            if dataset is not None:
                digest.update(f"{dataset.dtype.str} {dataset.sizes_digest}".encode())
                digest.update(memoryview(np.ascontiguousarray(dataset.tokens)))
        digest.update(self.kept.astype(np.int64).tobytes())
        return digest.hexdigest()


class PairDocuments(_Documents):
    """Preference pairs: document i of the chosen files with document i of the rejected ones. Samples
    are shaped as nxd-data's preference pairs (`input_ids`, `labels`, `position_ids` of shape
    (2, seq_length), chosen first), plus `reference_log_probs` (2,) with reference files, and, with
    `scores` (a reward model's data), `score_position` (each row's last trained position: where
    GPT-NeoX's `--for-rm` labels put the score) and `margin` (0)."""

    def __init__(
        self,
        chosen: DocumentFiles,
        rejected: DocumentFiles,
        seq_length: int,
        pad_id: int,
        *,
        allow_chopped: bool = True,
        scores: bool = False,
        vocab_size: int | None = None,
    ):
        self.sides = (_Side(chosen, vocab_size, seq_length), _Side(rejected, vocab_size, seq_length))
        if len(self.sides[0]) != len(self.sides[1]):
            raise DataError(
                f"{rejected.where}: {rejected.tokens} holds {len(self.sides[1])} documents where "
                f"{chosen.tokens} holds {len(self.sides[0])}; expected one rejected response per chosen "
                "one, in the same order"
            )
        for role in ("labels", "reference"):
            if (getattr(chosen, role) is None) != (getattr(rejected, role) is None):
                raise DataError(
                    f"{chosen.where}: expected {role} files for both chosen and rejected documents or for "
                    "neither, found one"
                )
        self.seq_length, self.pad_id, self.scores = seq_length, pad_id, scores
        usable = [side.usable(seq_length, allow_chopped) for side in self.sides]
        self.kept = np.flatnonzero(usable[0] & usable[1])
        self.left_out = len(self.sides[0]) - len(self.kept)
        if not len(self.kept):
            raise DataError(
                f"{chosen.where}: none of the {len(self.sides[0])} pairs has both responses within "
                f"seq_length + 1 ({seq_length + 1}) tokens with something to train on"
            )

    @property
    def carries_reference(self) -> bool:
        return self.sides[0].reference is not None

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        document = int(self.kept[int(index)])
        rows = [side.row(document, self.seq_length) for side in self.sides]
        return self._sample([(tokens, labels) for tokens, labels, _ in rows], [reference for *_, reference in rows])

    def padding(self) -> dict[str, torch.Tensor]:
        """A pair that adds nothing to the loss (fills a short evaluation batch)."""
        empty = np.zeros(0, dtype=np.int64)
        return self._sample([(empty, empty), (empty, empty)], [0.0, 0.0])

    def _sample(self, rows: list[tuple[np.ndarray, np.ndarray]], references: list[float]) -> dict[str, torch.Tensor]:
        filled = [_fill(self.seq_length, self.pad_id, tokens, labels) for tokens, labels in rows]
        labels = np.stack([row[1] for row in filled])
        sample = {
            "input_ids": torch.from_numpy(np.stack([row[0] for row in filled])),
            "labels": torch.from_numpy(labels),
            "position_ids": torch.arange(self.seq_length).expand(2, -1).clone(),
        }
        if self.carries_reference:
            sample[REFERENCE_KEY] = torch.tensor(references, dtype=torch.float64)
        if self.scores:
            counted = labels != IGNORE_INDEX
            last = np.where(counted.any(-1), self.seq_length - 1 - np.argmax(counted[:, ::-1], axis=-1), 0)
            sample |= {
                "score_position": torch.from_numpy(last.astype(np.int64)),
                "margin": torch.zeros(2, dtype=torch.float64),
            }
        return sample


class ExampleDocuments(_Documents):
    """KTO examples: one row per document, with `kto_reward` (the document's reward), `kto_label`
    (1.0 when the reward is positive) and, with a reference file, `reference_log_probs`."""

    def __init__(
        self,
        files: DocumentFiles,
        rewards: str,
        seq_length: int,
        pad_id: int,
        *,
        allow_chopped: bool = True,
        rewards_where: str = "data",
        vocab_size: int | None = None,
    ):
        self.sides = (_Side(files, vocab_size, seq_length),)
        self.rewards = _open(rewards, rewards_where, files.impl)
        documents = len(self.sides[0])
        if len(self.rewards) != documents:
            raise DataError(
                f"{rewards_where}: {rewards}: expected one reward document per document of "
                f"{files.tokens} ({documents}), found {len(self.rewards)}"
            )
        if bad := np.flatnonzero(self.rewards.sizes != 1)[:1].tolist():
            raise DataError(
                f"{rewards_where}: {rewards}: document {bad[0]}: expected one reward, found "
                f"{self.rewards.sizes[bad[0]]} values"
            )
        self.seq_length, self.pad_id = seq_length, pad_id
        self.kept = np.flatnonzero(self.sides[0].usable(seq_length, allow_chopped))
        self.left_out = documents - len(self.kept)
        if not len(self.kept):
            raise DataError(
                f"{files.where}: none of the {documents} documents is within seq_length + 1 "
                f"({seq_length + 1}) tokens with something to train on"
            )
        starts = self.rewards.pointers // self.rewards.dtype.itemsize
        self.values = np.asarray(self.rewards.tokens[starts[self.kept]], dtype=np.float64)
        if not np.isfinite(self.values).all():
            raise DataError(
                f"{rewards_where}: {rewards}: expected finite rewards, found "
                f"{self.values[~np.isfinite(self.values)][0]}"
            )

    @property
    def carries_reference(self) -> bool:
        return self.sides[0].reference is not None

    @property
    def desirable(self) -> int:
        return int((self.values > NEUTRAL).sum())

    @property
    def undesirable(self) -> int:
        return int((self.values < -NEUTRAL).sum())

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens, labels, reference = self.sides[0].row(int(self.kept[int(index)]), self.seq_length)
        return self._sample(tokens, labels, reference, float(self.values[int(index)]))

    def padding(self) -> dict[str, torch.Tensor]:
        """An example that adds nothing to the loss or to the KL estimate."""
        empty = np.zeros(0, dtype=np.int64)
        return self._sample(empty, empty, 0.0, 0.0)

    def _sample(
        self, tokens: np.ndarray, labels: np.ndarray, reference: float, reward: float
    ) -> dict[str, torch.Tensor]:
        input_ids, labels = _fill(self.seq_length, self.pad_id, tokens, labels)
        sample = {
            "input_ids": torch.from_numpy(input_ids),
            "labels": torch.from_numpy(labels),
            "position_ids": torch.arange(self.seq_length),
            REWARD_KEY: torch.tensor(reward, dtype=torch.float64),
            LABEL_KEY: torch.tensor(float(reward > NEUTRAL), dtype=torch.float64),
        }
        if self.carries_reference:
            sample[REFERENCE_KEY] = torch.tensor(reference, dtype=torch.float64)
        return sample
