"""Megatron's GPT dataset indices against a transcription of Megatron-LM's own algorithm (the C++
build_sample_idx loop and legacy _build_index_mappings), hand-worked splits and sample windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from nxd_data import DataError, GPTDataset, IndexedDataset, IndexedDatasetWriter, SampleFormat
from nxd_data.errors import DataWarning
from nxd_data.gpt_dataset import split_documents
from nxd_data.indices import build_indices


def megatron_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch, add_extra_token=1):
    """helpers.cpp build_sample_idx, line by line."""
    num_samples = (num_epochs * tokens_per_epoch - add_extra_token) // seq_length
    sample_idx = np.zeros((num_samples + 1, 2), dtype=np.int64)
    sample_index, doc_idx_index, doc_offset = 1, 0, 0
    while sample_index <= num_samples:
        remaining = seq_length + add_extra_token
        while remaining != 0:
            doc_length = sizes[doc_idx[doc_idx_index]] - doc_offset
            remaining -= doc_length
            if remaining <= 0:
                doc_offset += remaining + doc_length - add_extra_token
                remaining = 0
            else:
                doc_idx_index += 1
                doc_offset = 0
        sample_idx[sample_index] = (doc_idx_index, doc_offset)
        sample_index += 1
    return sample_idx


def megatron_index_mappings(documents, sizes, num_samples, seq_length, seed, add_extra_token=1):
    """Megatron-LM legacy gpt_dataset._build_index_mappings (without the caching)."""
    tokens_per_epoch = np.sum(sizes[documents])
    num_epochs, total = 0, 0
    while True:
        num_epochs += 1
        total += tokens_per_epoch
        if (total - add_extra_token) // seq_length >= num_samples:
            break
    rng = np.random.RandomState(seed=seed)
    if num_epochs == 1:
        separate_last_epoch = False
    else:
        from_minus_one = ((num_epochs - 1) * tokens_per_epoch - add_extra_token) // seq_length
        last_epoch_num_samples = num_samples - from_minus_one
        per_epoch = (tokens_per_epoch - add_extra_token) // seq_length
        separate_last_epoch = last_epoch_num_samples < int(0.80 * per_epoch)

    def doc_index(epochs, separate):
        if not separate or epochs == 1:
            idx = np.mgrid[0:epochs, 0 : len(documents)][1]
            idx[:] = documents
            idx = idx.reshape(-1).astype(np.int32)
            rng.shuffle(idx)
            return idx
        return np.concatenate((doc_index(epochs - 1, False), doc_index(1, False)))

    doc_idx = doc_index(num_epochs, separate_last_epoch)
    sample_idx = megatron_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch, add_extra_token)
    total_samples = sample_idx.shape[0] - 1
    shuffled = from_minus_one if separate_last_epoch else total_samples
    first = np.arange(0, shuffled, dtype=np.uint32)
    rng.shuffle(first)
    if shuffled == total_samples:
        return doc_idx, sample_idx, first
    last = np.arange(shuffled, total_samples, dtype=np.uint32)
    rng.shuffle(last)
    return doc_idx, sample_idx, np.concatenate((first, last))


@pytest.mark.parametrize("extra", [1, 0])
@pytest.mark.parametrize(("num_samples", "seq_length", "seed"), [(10, 7, 1), (57, 5, 3), (200, 16, 1234), (31, 40, 9)])
def test_indices_equal_megatrons(num_samples: int, seq_length: int, seed: int, extra: int) -> None:
    sizes = np.random.default_rng(0).integers(0, 30, size=40).astype(np.int32)  # zero-length documents included
    documents = np.arange(5, 35)
    ours = build_indices(sizes, documents, num_samples, seq_length, seed, extra)
    doc_idx, sample_idx, shuffle_idx = megatron_index_mappings(documents, sizes, num_samples, seq_length, seed, extra)
    np.testing.assert_array_equal(ours.doc_idx, doc_idx)
    np.testing.assert_array_equal(ours.sample_idx, sample_idx)
    np.testing.assert_array_equal(ours.shuffle_idx, shuffle_idx)


def test_splits_worked_by_hand() -> None:
    assert split_documents("980,10,10", 1000) == [(0, 980), (980, 990), (990, 1000)]
    # 10 documents in thirds: rounded bounds 0, 3, 6, 9; the missing one shifts every bound after the first
    assert split_documents("1,1,1", 10) == [(0, 4), (4, 7), (7, 10)]
    assert split_documents("1", 6) == [(0, 6), (6, 6), (6, 6)]


def write(prefix: Path, documents: list[list[int]]) -> IndexedDataset:
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for document in documents:
            writer.add_document(document)
    return IndexedDataset(prefix)


def test_samples_are_overlapping_windows_of_each_epochs_shuffled_stream(tmp_path: Path) -> None:
    """45 tokens give (45 - 1) // 4 = 11 samples an epoch; 22 samples take two epochs, each its own
    shuffle of the documents and of the samples, the first Megatron's for one epoch with this seed."""
    documents = [list(range(100 * d, 100 * d + n)) for d, n in enumerate([5, 9, 3, 12, 7, 1, 8])]
    indexed = write(tmp_path / "d", documents)
    dataset = GPTDataset(indexed, "train", (0, 7), 22, SampleFormat(seq_length=4, eod_id=0), seed=5, cache_dir=tmp_path)
    assert dataset.samples_per_epoch == 11
    doc_idx, _, shuffle_idx = megatron_index_mappings(np.arange(7), indexed.sizes, 11, 4, 5, 1)
    np.testing.assert_array_equal(dataset.indices(0).doc_idx, doc_idx)
    np.testing.assert_array_equal(dataset.indices(0).shuffle_idx, shuffle_idx)
    assert not np.array_equal(dataset.indices(1).doc_idx, doc_idx)
    for index in range(len(dataset)):
        epoch, number = divmod(index, 11)
        indices = dataset.indices(epoch)
        stream = np.concatenate([documents[d] for d in indices.doc_idx])
        start = int(indices.shuffle_idx[number]) * 4
        assert dataset.tokens(index).tolist() == stream[start : start + 5].tolist()
    every_token = sorted(token for document in documents for token in document)
    for epoch in range(2):  # each epoch reads every token but its one leftover (45 = 11 x 4 + 1)
        read = sorted(int(t) for index in range(11 * epoch, 11 * epoch + 11) for t in dataset.tokens(index)[:4])
        assert len(read) == 44 and set(read) <= set(every_token)
    sample = dataset[0]
    window = dataset.tokens(0)
    assert sample["input_ids"].tolist() == window[:4].tolist()
    assert sample["labels"].tolist() == window[1:].tolist()


def test_a_longer_run_continues_the_stream_of_a_shorter_one(tmp_path: Path) -> None:
    """Sample k does not depend on how many samples were asked for (a raised max_steps), across epochs."""
    indexed = write(tmp_path / "d", [list(range(1, n + 1)) for n in [5, 9, 3, 12, 7, 1, 8]])
    fmt = SampleFormat(seq_length=4, eod_id=0)
    short = GPTDataset(indexed, "train", (0, 7), 15, fmt, seed=5, cache_dir=tmp_path / "a")
    long = GPTDataset(indexed, "train", (0, 7), 60, fmt, seed=5, cache_dir=tmp_path / "b")
    assert [short.tokens(i).tolist() for i in range(15)] == [long.tokens(i).tolist() for i in range(15)]
    assert len({tuple(long.indices(epoch).doc_idx) for epoch in range(6)}) == 6  # every epoch shuffled anew


def test_indices_are_cached_under_what_defines_them(tmp_path: Path) -> None:
    indexed = write(tmp_path / "d", [[1, 2, 3]] * 20)
    fmt = SampleFormat(seq_length=4, eod_id=0)
    GPTDataset(indexed, "train", (0, 20), 10, fmt, seed=1, cache_dir=tmp_path / "cache")
    files = sorted(p.name for p in (tmp_path / "cache").glob("*.npy"))
    assert len(files) == 3
    stamps = [p.stat().st_mtime_ns for p in sorted((tmp_path / "cache").glob("*.npy"))]
    GPTDataset(indexed, "train", (0, 20), 10, fmt, seed=1, cache_dir=tmp_path / "cache")
    assert [p.stat().st_mtime_ns for p in sorted((tmp_path / "cache").glob("*.npy"))] == stamps
    GPTDataset(indexed, "train", (0, 20), 10, fmt, seed=2, cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 6


@pytest.mark.parametrize("damage", ["truncate", "overwrite", "delete"])
def test_damaged_cached_indices_are_built_again(tmp_path: Path, damage: str) -> None:
    """A cached index file truncated, overwritten with other valid numbers, or deleted is noticed (its
    size and XXH3-64 against the cache marker), said in a warning, and built again, the same as before."""
    indexed = write(tmp_path / "d", [[1, 2, 3]] * 20)
    fmt = SampleFormat(seq_length=4, eod_id=0)
    first = GPTDataset(indexed, "train", (0, 20), 10, fmt, seed=1, cache_dir=tmp_path / "cache")
    expected = [first[i]["input_ids"].tolist() for i in range(len(first))]
    (shuffle,) = (tmp_path / "cache").glob("*shuffle_idx.npy")
    if damage == "truncate":
        shuffle.write_bytes(shuffle.read_bytes()[:-8])
    elif damage == "overwrite":
        values = np.load(shuffle)
        np.save(shuffle, values[::-1].copy())
    else:
        shuffle.unlink()
    with pytest.warns(DataWarning, match=f"{shuffle.name}.*building the indices again"):
        again = GPTDataset(indexed, "train", (0, 20), 10, fmt, seed=1, cache_dir=tmp_path / "cache")
    assert [again[i]["input_ids"].tolist() for i in range(len(again))] == expected


def test_a_split_too_small_for_one_sample_is_refused(tmp_path: Path) -> None:
    indexed = write(tmp_path / "d", [[1, 2]])
    with pytest.raises(DataError, match=r"d: the train split holds 2 tokens in 1 documents; expected at least"):
        GPTDataset(indexed, "train", (0, 1), None, SampleFormat(seq_length=4, eod_id=0), seed=1, cache_dir=tmp_path)


def test_sample_format_keys() -> None:
    eod = 0
    window = np.array([5, 6, 0, 7, 8, 0, 9])
    plain = SampleFormat(seq_length=6, eod_id=eod).sample(window)
    assert plain["labels"].tolist() == [6, 0, 7, 8, 0, 9]
    masked = SampleFormat(seq_length=6, eod_id=eod, eod_mask_loss=True).sample(window)
    assert masked["labels"].tolist() == [6, -100, 7, 8, -100, 9]
    reset = SampleFormat(seq_length=6, eod_id=eod, reset_position_ids=True).sample(window)
    assert reset["position_ids"].tolist() == [0, 1, 2, 0, 1, 2]
    exact = SampleFormat(seq_length=7, eod_id=eod, plus_one=False).sample(window)
    assert exact["input_ids"].tolist() == window.tolist()
    assert exact["labels"].tolist() == [6, 0, 7, 8, 0, 9, -100]
    documents = SampleFormat(seq_length=6, eod_id=eod, reset_attention_mask=True).sample(window)
    assert documents["document_ids"].tolist() == [0, 0, 0, 1, 1, 1]  # an EOD ends its own document
    padding = SampleFormat(seq_length=6, eod_id=eod).padding()
    assert padding["labels"].tolist() == [-100] * 6


def _open_in_a_process(prefix: str, cache: str, log: str, result: str) -> None:
    import nxd_data.indices as indices

    build = indices.build_indices

    def logged(*args, **kwargs):
        with open(log, "a") as handle:
            handle.write("built\n")
        return build(*args, **kwargs)

    indices.build_indices = logged
    dataset = GPTDataset(
        IndexedDataset(prefix),
        "train",
        (0, 200),
        500,
        SampleFormat(seq_length=8, eod_id=0),
        seed=3,
        cache_dir=Path(cache),
    )
    np.save(result, np.stack([dataset.tokens(i) for i in range(len(dataset))]))


def test_concurrent_processes_build_the_indices_once(tmp_path: Path) -> None:
    import multiprocessing

    write(tmp_path / "d", [[1, 2, 3, 4, 5]] * 200)
    context = multiprocessing.get_context("fork")
    processes = [
        context.Process(
            target=_open_in_a_process,
            args=(str(tmp_path / "d"), str(tmp_path / "cache"), str(tmp_path / "log"), str(tmp_path / f"r{i}.npy")),
        )
        for i in range(3)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    assert (tmp_path / "log").read_text() == "built\n" * 5  # 500 samples of 124 an epoch: five epochs, each once
    results = [np.load(tmp_path / f"r{i}.npy") for i in range(3)]
    assert all(np.array_equal(results[0], other) for other in results[1:])


def test_a_label_file_gives_the_labels_and_masks_exactly_its_negative_positions(tmp_path: Path) -> None:
    """GPT-NeoX's label data: the label file's span of each sample, shifted by one as the tokens are, in place
    of the tokens; -100 positions are not trained on, every other position keeps its label."""
    documents = [list(range(100 * d + 1, 100 * d + 1 + n)) for d, n in enumerate([5, 9, 3, 12, 7, 1, 8])]
    masked = {(1, 0), (1, 1), (1, 2), (3, 5), (6, 7)}  # (document, position) of a -100 label
    label_documents = [
        [-100 if (d, i) in masked else token + 10_000 for i, token in enumerate(document)]
        for d, document in enumerate(documents)
    ]
    indexed = write(tmp_path / "d", documents)
    with IndexedDatasetWriter(tmp_path / "l", np.int32) as writer:
        for document in label_documents:
            writer.add_document(document)
    labels = IndexedDataset(tmp_path / "l")
    fmt = SampleFormat(seq_length=4, eod_id=0)
    plain = GPTDataset(indexed, "train", (0, 7), 11, fmt, seed=5, cache_dir=tmp_path)
    labelled = GPTDataset(indexed, "train", (0, 7), 11, fmt, seed=5, cache_dir=tmp_path, labels=labels)
    label_of = {
        token: label
        for document, label_document in zip(documents, label_documents, strict=True)
        for token, label in zip(document, label_document, strict=True)
    }
    ignored = 0
    for index in range(11):
        ours, theirs = labelled[index], plain[index]
        assert ours["input_ids"].tolist() == theirs["input_ids"].tolist()
        expected = [label_of[token] for token in theirs["labels"].tolist()]  # the label of each next token
        assert ours["labels"].tolist() == expected
        ignored += expected.count(-100)
    assert ignored > 0


def test_a_label_file_of_other_documents_is_refused(tmp_path: Path) -> None:
    indexed = write(tmp_path / "d", [[1, 2, 3], [4, 5, 6, 7]])
    with IndexedDatasetWriter(tmp_path / "l", np.int32) as writer:
        for document in ([1, 2, 3], [4, 5, 6]):
            writer.add_document(document)
    with pytest.raises(DataError, match=r"l.idx: document 1 holds 3 labels; its data file .*d.idx holds 4 tokens"):
        GPTDataset(
            indexed,
            "train",
            (0, 2),
            1,
            SampleFormat(seq_length=4, eod_id=0),
            seed=5,
            cache_dir=tmp_path,
            labels=IndexedDataset(tmp_path / "l"),
        )


def test_written_data_files_follow_the_umask(tmp_path):
    """mkstemp makes 0600 files; a data set written for others to read gets the mode a plain open gives."""
    import os

    previous = os.umask(0o022)
    try:
        with IndexedDatasetWriter(tmp_path / "corpus", np.uint16) as writer:
            writer.add_document([1, 2, 3])
    finally:
        os.umask(previous)
    assert {path.suffix: path.stat().st_mode & 0o777 for path in tmp_path.iterdir()} == {".bin": 0o644, ".idx": 0o644}
