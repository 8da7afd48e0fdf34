"""Exact resume: a sampler restored at consumed_samples = k yields what an uninterrupted one yields next,
for every data-parallel rank, also when the data-parallel size changes."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from nxd_data import PADDING, PretrainingSampler

GBS, MBS, TOTAL, STEPS = 8, 2, 37, 12


def per_step(sampler: PretrainingSampler, steps: int) -> list[list[int]]:
    """Each step's samples, rank by rank and micro-batch by micro-batch, flattened in that order."""
    batches = list(itertools.islice(iter(sampler), steps * sampler.accumulation))
    return [sum(batches[s * sampler.accumulation : (s + 1) * sampler.accumulation], []) for s in range(steps)]


def global_steps(dp: int, consumed: int, steps: int, **options) -> list[set[int]]:
    """What all ranks of a dp-sized run read, step by step, as sets of sample ids."""
    ranks = [PretrainingSampler(TOTAL, GBS, MBS, dp, r, consumed_samples=consumed, **options) for r in range(dp)]
    per_rank = [per_step(sampler, steps) for sampler in ranks]
    return [set().union(*(rank[s] for rank in per_rank)) for s in range(steps)]


@pytest.mark.parametrize("options", [{}, {"shuffle": True, "seed": 4}, {"shuffle": True, "reshuffle_each_epoch": True}])
@pytest.mark.parametrize(("saved_dp", "resumed_dp"), [(1, 1), (2, 2), (2, 1), (1, 2)])
def test_resume_reads_what_an_uninterrupted_run_reads(options: dict, saved_dp: int, resumed_dp: int) -> None:
    k = 5
    uninterrupted = [PretrainingSampler(TOTAL, GBS, MBS, resumed_dp, r, **options) for r in range(resumed_dp)]
    saved = PretrainingSampler(TOTAL, GBS, MBS, saved_dp, 0, **options)
    state = {**saved.state_dict(), "consumed_samples": k * GBS}  # the loop advances it by GBS per step
    for rank, sampler in enumerate(uninterrupted):
        resumed = PretrainingSampler(TOTAL, GBS, MBS, resumed_dp, rank, **options).resumed(state)
        assert per_step(resumed, STEPS - k) == per_step(sampler, STEPS)[k:]
    assert global_steps(saved_dp, 0, STEPS, **options) == global_steps(resumed_dp, 0, STEPS, **options)


def test_ranks_split_each_global_batch_into_disjoint_micro_batches() -> None:
    ranks = [per_step(PretrainingSampler(TOTAL, GBS, MBS, 2, r), 1)[0] for r in range(2)]
    assert not set(ranks[0]) & set(ranks[1])
    assert sorted(ranks[0] + ranks[1]) == list(range(GBS))
    assert ranks[0] == [0, 1, 4, 5]  # micro-batch m of rank r: slice (m * dp + r) * mbs


def test_epochs_drop_the_partial_batch_and_reshuffle_when_asked() -> None:
    steps = per_step(PretrainingSampler(TOTAL, GBS, MBS, shuffle=True, reshuffle_each_epoch=True, seed=1), 8)
    first, second = sum(steps[:4], []), sum(steps[4:], [])
    assert len(set(first)) == 32 and len(set(second)) == 32 and first != second
    fixed = per_step(PretrainingSampler(TOTAL, GBS, MBS, shuffle=True, seed=1), 8)
    assert sum(fixed[:4], []) == sum(fixed[4:], [])


def test_a_short_last_batch_is_padded_so_every_rank_runs_the_same_micro_batches() -> None:
    # 37 samples, no drop_last: the last global batch holds 5 samples (32..36)
    options = dict(drop_last=False, steps=None)
    for pad in (False, True):
        ranks = [list(PretrainingSampler(TOTAL, GBS, MBS, 2, r, pad_to_global_batch=pad, **options)) for r in range(2)]
        assert len(ranks[0]) == len(ranks[1])
        last = [batch for rank in ranks for batch in rank[-2:]]
        assert sorted(i for batch in last for i in batch if i != PADDING) == [32, 33, 34, 35, 36]
        if pad:
            assert all(len(batch) == MBS for batch in last)
    unpadded = [list(PretrainingSampler(TOTAL, GBS, MBS, 2, r, **options)) for r in range(2)]
    assert unpadded[0][-2:] == [[32, 33], [36]] and unpadded[1][-2:] == [[34, 35], [PADDING]]


def test_a_state_from_another_stream_is_refused() -> None:
    state = PretrainingSampler(TOTAL, GBS, MBS, shuffle=True, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed was 1, this run has 2"):
        PretrainingSampler(TOTAL, GBS, MBS, shuffle=True, seed=2).resumed(state)


def test_a_longer_stream_continues_a_shorter_ones_position() -> None:
    """A run of 5 steps (40 samples) resumed with 10 steps (80): the positions it reads next are those
    a straight 80-sample run reads, on every rank."""
    state = PretrainingSampler(40, GBS, MBS, 2, 0, consumed_samples=40).state_dict()
    for rank in range(2):
        resumed = PretrainingSampler(80, GBS, MBS, 2, rank).resumed(state, steps=5)
        straight = PretrainingSampler(80, GBS, MBS, 2, rank)
        assert list(resumed) == list(itertools.islice(iter(straight), 10 * straight.accumulation))[5 * 2 :]


@pytest.mark.parametrize(
    ("options", "consumed", "why"),
    [
        ({"shuffle": True}, 16, "its shuffled order is drawn over all of them"),
        ({}, 48, "its position lies beyond the first pass of the shorter stream"),
    ],
)
def test_another_length_is_refused_where_the_order_would_differ(options: dict, consumed: int, why: str) -> None:
    state = PretrainingSampler(40, GBS, MBS, consumed_samples=consumed, **options).state_dict()
    with pytest.raises(ValueError, match=f"total_samples was 40, this run has 80, and {why}"):
        PretrainingSampler(80, GBS, MBS, **options).resumed(state)


@pytest.mark.parametrize(("saved_dp", "resumed_dp"), [(1, 1), (2, 2), (2, 1)])
def test_data_loaders_with_workers_resume_exactly(saved_dp: int, resumed_dp: int) -> None:
    from torch.utils.data import DataLoader

    def loader(dp: int, rank: int, sampler_state: dict | None, steps: int) -> list[list[int]]:
        sampler = PretrainingSampler(TOTAL, GBS, MBS, dp, rank, shuffle=True, seed=7, steps=steps)
        if sampler_state is not None:
            sampler = sampler.resumed(sampler_state, steps=steps)
        batches = DataLoader(range(TOTAL), batch_sampler=sampler, num_workers=2)
        return [batch.tolist() for batch in batches]

    k = 4
    state = {
        **PretrainingSampler(TOTAL, GBS, MBS, saved_dp, 0, shuffle=True, seed=7).state_dict(),
        "consumed_samples": k * GBS,
    }
    for rank in range(resumed_dp):
        accumulation = GBS // (MBS * resumed_dp)
        assert loader(resumed_dp, rank, state, STEPS - k) == loader(resumed_dp, rank, None, STEPS)[k * accumulation :]


def test_length_grouping_sorts_each_megabatch_of_the_shuffled_order_longest_first():
    """transformers' group_by_length: the seeded permutation, cut into megabatches of up to 50 global batches,
    each sorted by length (descending); the stream is the same on resume, at any data-parallel size."""
    import numpy as np

    lengths = np.random.default_rng(3).integers(1, 500, size=200).astype(np.int64)
    grouped = PretrainingSampler(200, 4, 2, shuffle=True, seed=7, lengths=lengths.tobytes(), steps=50)
    plain = PretrainingSampler(200, 4, 2, shuffle=True, seed=7, steps=50)
    order, permutation = grouped.order(0), plain.order(0)
    megabatch = 4 * min(200 // 16, 50)
    for start in range(0, 200, megabatch):
        part = order[start : start + megabatch]
        assert sorted(part.tolist()) == sorted(permutation[start : start + megabatch].tolist())
        assert all(lengths[a] >= lengths[b] for a, b in zip(part, part[1:], strict=False))
    whole = [index for batch in grouped for index in batch]
    resumed = grouped.resumed(replace(grouped, consumed_samples=40).state_dict(), steps=40)
    halves = [replace(resumed, data_parallel_size=2, data_parallel_rank=rank) for rank in (0, 1)]
    later = [index for pair in zip(*(list(h) for h in halves), strict=True) for batch in pair for index in batch]
    assert later == whole[40:]
    with pytest.raises(ValueError, match="group_by_length"):
        plain.resumed(grouped.state_dict())
