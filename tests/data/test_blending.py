"""Blending by weight: Megatron's greedy rule worked by hand, and the datasets built from data_prefix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from nxd_data import DataError, IndexedDatasetWriter, MegatronDataBuilder, SampleFormat
from nxd_data.blending import BlendedDataset, blend_indices, normalise_weights, weights_by_documents


def test_greedy_assignment_worked_by_hand() -> None:
    # sample i goes to the source with the largest weight * max(i, 1) - drawn, ties to the first:
    # i=0: .5 .25 .25 -> 0;  i=1: -.5 .25 .25 -> 1;  i=2: 0 -.5 .5 -> 2;  i=3: .5 -.25 -.25 -> 0;
    # i=4: 0 0 0 -> 0;  i=5: -.5 .25 .25 -> 1;  i=6: 0 -.5 .5 -> 2;  i=7: .5 -.25 -.25 -> 0
    sources, numbers = blend_indices([0.5, 0.25, 0.25], 8)
    assert sources.tolist() == [0, 1, 2, 0, 0, 1, 2, 0]
    assert numbers.tolist() == [0, 0, 0, 1, 2, 1, 1, 3]


def test_shares_stay_within_one_sample_of_the_weights() -> None:
    weights = [0.2, 0.5, 0.3]
    sources, _ = blend_indices(weights, 1000)
    for size in (10, 333, 1000):
        counts = np.bincount(sources[:size], minlength=3)
        assert np.all(np.abs(counts - np.array(weights) * size) <= 1)


@pytest.mark.parametrize("weights", [[0, 0], [-1, 2], [float("inf"), 1], [float("nan"), 1]])
def test_weights_must_be_finite_with_a_positive_sum(weights: list[float]) -> None:
    with pytest.raises(
        DataError,
        match=r"data_prefix: expected finite, non-negative blend weights with a positive "
        r"sum, found \[",
    ):
        BlendedDataset([[1], [2]], weights, 2)


def test_huge_weights_blend_by_their_ratio():
    """1e308 and 1e308 sum to infinity in floats; as weights they are one half each."""
    assert normalise_weights([1e308, 1e308], "data_prefix") == [0.5, 0.5]
    assert normalise_weights([1e308, 7.5e307], "data_prefix") == pytest.approx([4 / 7, 3 / 7])


def corpus(prefix: Path, start: int, documents: int = 40) -> str:
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for document in range(documents):
            writer.add_document([start + document] * 7)
    return str(prefix)


def test_blended_splits_draw_from_each_prefix_by_weight(tmp_path: Path) -> None:
    first, second = corpus(tmp_path / "a", 1000), corpus(tmp_path / "b", 2000)
    builder = MegatronDataBuilder(SampleFormat(seq_length=6, eod_id=0), seed=3, cache_dir=tmp_path / "cache")
    splits = builder.build([3, first, 1, second], "8,1,1", [40, None, None])
    train = splits["train"]
    assert len(train) == 40
    origin = [int(train[i]["input_ids"][0]) // 1000 for i in range(40)]
    assert origin.count(1) == 30 and origin.count(2) == 10
    assert splits["validation"] is not None and splits["test"] is not None


def test_a_blend_per_split_uses_whole_prefixes(tmp_path: Path) -> None:
    first, second = corpus(tmp_path / "a", 1000), corpus(tmp_path / "b", 2000, documents=4)
    builder = MegatronDataBuilder(SampleFormat(seq_length=6, eod_id=0), seed=3, cache_dir=tmp_path / "cache")
    splits = builder.build({"train": first, "validation": second, "test": None}, "980,10,10", [10, None, None])
    assert {int(splits["train"][i]["input_ids"][0]) // 1000 for i in range(10)} == {1}
    assert len(splits["validation"]) == (4 * 7 - 1) // 6  # one epoch of the whole prefix
    assert splits["test"] is None


def test_a_missing_prefix_is_named(tmp_path: Path) -> None:
    builder = MegatronDataBuilder(SampleFormat(seq_length=6, eod_id=0), seed=3, cache_dir=tmp_path)
    with pytest.raises(DataError, match=r"data prefix .*absent: expected absent\.idx and absent\.bin"):
        builder.build([1, str(tmp_path / "absent")], "1,0,0", [4, None, None])


def test_weights_by_document_counts_worked_by_hand() -> None:
    # 10 and 30 documents: shares .25, .75. alpha 1: p = .25, .75; x (1 - share) = .1875, .1875 -> .5, .5.
    assert weights_by_documents([10, 30], 1.0) == pytest.approx([0.5, 0.5])
    # alpha .5: sqrt .5, .8660254 -> p .3660254, .6339746; x .75, .25 -> .2745190, .1584937 -> .6339746, .3660254
    assert weights_by_documents([10, 30], 0.5) == pytest.approx([0.6339746, 0.3660254])
    assert weights_by_documents([7], 0.3) == [1.0]


def test_a_blend_by_documents_replaces_the_listed_weights(tmp_path: Path) -> None:
    """GPT-NeoX's weight_by_num_documents: 10 and 30 documents at alpha 1 draw half the samples from each."""
    first, second = corpus(tmp_path / "a", 1000, documents=10), corpus(tmp_path / "b", 2000, documents=30)
    builder = MegatronDataBuilder(
        SampleFormat(seq_length=6, eod_id=0), seed=3, cache_dir=tmp_path / "cache", documents_alpha=1.0
    )
    train = builder.build({"train": [9, first, 1, second], "validation": None, "test": None}, "", [20, None, None])[
        "train"
    ]
    origin = [int(train[i]["input_ids"][0]) // 1000 for i in range(20)]
    assert origin.count(1) == 10 and origin.count(2) == 10
