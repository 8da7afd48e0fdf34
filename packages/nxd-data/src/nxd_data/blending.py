"""Blending several datasets by weight, with Megatron's greedy error-minimising assignment."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .errors import DataError


def normalise_weights(weights: Sequence[float], where: str) -> list[float]:
    """Weights scaled to sum to one (by the largest first, so that huge ones such as 1e308 do not overflow
    the sum); a DataError naming `where` unless they are finite, non-negative and not all zero."""
    values = [float(weight) for weight in weights]
    if not values or any(not math.isfinite(value) or value < 0 for value in values) or max(values) == 0:
        raise DataError(f"{where}: expected finite, non-negative blend weights with a positive sum, found {values}")
    largest = max(values)
    scaled = [value / largest for value in values]
    return [value / sum(scaled) for value in scaled]


def weights_by_documents(documents: Sequence[int], alpha: float) -> list[float]:
    """Blend weights from each source's document count n (N in all): p = (n/N)^alpha normalised, times
    1 - n/N, normalised again; alpha below 1 raises the share of small sources (XLM-R's sampling, as GPT-NeoX's
    weight_by_num_documents computes it). One source gets weight 1."""
    if len(documents) == 1:
        return [1.0]
    total = sum(documents)
    shares = [count / total for count in documents]
    raised = [share**alpha for share in shares]
    probabilities = [value / sum(raised) for value in raised]
    weights = [p * (1 - share) for p, share in zip(probabilities, shares, strict=True)]
    return [weight / sum(weights) for weight in weights]


def blend_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Which dataset each of `size` samples comes from, and its sample number there: sample i goes to
    the dataset furthest behind its share (weight * max(i, 1) - drawn so far; ties to the first), as
    Megatron's helpers.build_blending_indices does."""
    drawn = [0] * len(weights)
    sources = np.empty(size, dtype=np.int16)
    numbers = np.empty(size, dtype=np.int64)
    for sample in range(size):
        scale = max(sample, 1.0)
        errors = [weight * scale - count for weight, count in zip(weights, drawn, strict=True)]
        chosen = errors.index(max(errors))
        sources[sample], numbers[sample] = chosen, drawn[chosen]
        drawn[chosen] += 1
    return sources, numbers


class BlendedDataset(Dataset):
    """`size` samples drawn from `datasets` in proportion to `weights` (normalised here)."""

    def __init__(self, datasets: Sequence[Dataset], weights: Sequence[float], size: int, where: str = "data_prefix"):
        self.datasets, self.weights = list(datasets), normalise_weights(weights, where)
        self.sources, self.numbers = blend_indices(self.weights, size)
        for source, dataset in enumerate(self.datasets):
            needed = int((self.sources == source).sum())
            if needed > len(dataset):
                raise DataError(f"{where}: source {source} is asked for {needed} samples but holds {len(dataset)}")

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.datasets[int(self.sources[index])][int(self.numbers[index])]
