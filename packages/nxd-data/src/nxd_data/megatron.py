"""Train, validation and test datasets from `data_prefix`, as Megatron builds them: one prefix split
by `splits_string`, a weighted blend of prefixes (each split the same way), or a blend per split."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from torch.utils.data import Dataset

from .blending import BlendedDataset, normalise_weights, weights_by_documents
from .errors import DataError
from .gpt_dataset import GPTDataset, split_documents
from .indexed import IndexedDataset
from .samples import SampleFormat
from .whole_documents import WholeDocumentDataset

SPLITS = ("train", "validation", "test")
BLEND_MARGIN = 1.005
"""Each source builds this much more than its share, so the greedy assignment never runs it dry."""

Blend = str | Sequence[float | str]


def parse_blend(blend: Blend, where: str) -> list[tuple[float | None, str]]:
    """(weight, prefix) pairs; weight None when the prefixes were listed without weights."""
    if isinstance(blend, str):
        return [(1.0, blend)]
    items = list(blend)
    if all(isinstance(item, str) for item in items):
        return [(None, item) for item in items]
    if len(items) % 2 or not all(isinstance(p, str) for p in items[1::2]):
        raise DataError(f"{where}: expected [weight, prefix, weight, prefix, ...], found {items}")
    weights = normalise_weights([float(w) for w in items[0::2]], where)
    return list(zip(weights, items[1::2], strict=True))


class MegatronDataBuilder:
    """Builds the splits, opening each indexed dataset once. With `documents_alpha` the prefixes of each
    blend are weighted by their document counts (`weights_by_documents`), whatever weights were listed."""

    def __init__(
        self,
        format: SampleFormat,
        seed: int,
        cache_dir: Path | None,
        *,
        warmup: bool = False,
        documents_alpha: float | None = None,
        labels: Mapping[str, str] | None = None,
        packing: str = "packed",
        allow_chopped: bool = True,
        impl: str = "infer",
    ):
        """`labels`: data prefix -> the prefix of its label file (labels read in place of the shifted tokens);
        `packing` other than packed: samples of whole documents (`WholeDocumentDataset`); `impl`: the
        indexed format expected (data.data_impl)."""
        self.format, self.seed, self.cache_dir, self.warmup, self.impl = format, seed, cache_dir, warmup, impl
        self.documents_alpha, self.labels = documents_alpha, dict(labels or {})
        self.packing, self.allow_chopped = packing, allow_chopped
        self._opened: dict[str, IndexedDataset] = {}

    def open(self, prefix: str) -> IndexedDataset:
        if prefix not in self._opened:
            self._opened[prefix] = IndexedDataset(prefix, warmup=self.warmup, impl=self.impl)
        return self._opened[prefix]

    def build(
        self, data_prefix: Blend | Mapping[str, Blend | None], splits_string: str, num_samples: Sequence[int | None]
    ) -> dict[str, Dataset | None]:
        """{train, validation, test} -> dataset (None for an empty split); `num_samples` per split,
        None meaning one epoch of that split."""
        if isinstance(data_prefix, Mapping):
            return {
                split: self._blend(data_prefix[split], f"data.data_prefix.{split}", split, None, count)
                if data_prefix.get(split) is not None
                else None
                for split, count in zip(SPLITS, num_samples, strict=True)
            }
        return {
            split: self._blend(data_prefix, "data.data_prefix", split, splits_string, count)
            for split, count in zip(SPLITS, num_samples, strict=True)
        }

    def _blend(
        self, blend: Blend, where: str, split: str, splits_string: str | None, count: int | None
    ) -> Dataset | None:
        sources = parse_blend(blend, where)
        if self.documents_alpha is not None:  # by the documents each prefix holds, whole
            prefixes = [prefix for _, prefix in sources]
            counts = [len(self.open(prefix)) for prefix in prefixes]
            sources = list(zip(weights_by_documents(counts, self.documents_alpha), prefixes, strict=True))
        elif sources[0][0] is None:  # listed without weights: in proportion to their tokens
            sources = list(
                zip(
                    normalise_weights([self.open(p).num_tokens for _, p in sources], where),
                    [p for _, p in sources],
                    strict=True,
                )
            )
        parts = []
        for weight, prefix in sources:
            indexed = self.open(prefix)
            documents = (
                split_documents(splits_string, len(indexed))[SPLITS.index(split)]
                if splits_string
                else (0, len(indexed))
            )
            if documents[1] > documents[0] and weight > 0:
                parts.append((weight, indexed, documents))
        if not parts:
            return None
        if len(parts) == 1:
            return self._dataset(parts[0][1], split, parts[0][2], count)
        weights = normalise_weights([weight for weight, _, _ in parts], where)
        shares = [None if count is None else math.ceil(count * w * BLEND_MARGIN) for w in weights]
        datasets = [
            self._dataset(indexed, split, documents, share)
            for share, (_, indexed, documents) in zip(shares, parts, strict=True)
        ]
        if count is None:  # one epoch: as many samples as the scarcest source allows at its weight
            count = min(int((len(d) - 1) / w) for d, w in zip(datasets, weights, strict=True))
        return BlendedDataset(datasets, weights, count, where)

    def _dataset(self, indexed: IndexedDataset, split: str, documents: tuple[int, int], count: int | None) -> Dataset:
        label_prefix = self.labels.get(indexed.prefix)
        labels = None if label_prefix is None else self.open(label_prefix)
        if self.packing != "packed":
            return WholeDocumentDataset(
                indexed, split, documents, count, self.format, self.seed, self.packing, self.allow_chopped, labels
            )
        return GPTDataset(indexed, split, documents, count, self.format, self.seed, self.cache_dir, labels=labels)
