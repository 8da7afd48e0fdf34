"""GPT-NeoX's pack_impl unpacked and pack_until_overflow, worked by hand on a small index: which documents
each sample holds, the order samples are read in, allow_chopped, label files and the padded samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from nxd_data import DataError, IndexedDataset, IndexedDatasetWriter, SampleFormat
from nxd_data.whole_documents import WholeDocumentDataset

from tests.data.test_gpt_dataset import write

SIZES = [3, 5, 2, 9, 4, 1]
DOCUMENTS = [[10 * d + i + 1 for i in range(size)] for d, size in enumerate(SIZES)]
FORMAT = SampleFormat(seq_length=5, eod_id=0)  # windows of 6 tokens


def read_order(seed: int, documents: int, samples: int, shuffled_documents: bool) -> list[int]:
    """The epoch's sample order: RandomState(seed) shuffles the documents (pack_until_overflow), then the samples."""
    rng = np.random.RandomState(seed)
    if shuffled_documents:
        rng.permutation(documents)
    return rng.permutation(samples).tolist()


def test_unpacked_is_one_document_a_sample_cut_to_the_window(tmp_path: Path) -> None:
    data = WholeDocumentDataset(write(tmp_path / "d", DOCUMENTS), "train", (0, 6), None, FORMAT, 5, "unpacked")
    order = read_order(5, 6, 6, shuffled_documents=False)
    assert len(data) == 6 and [data.sample_documents(k) for k in range(6)] == [[d] for d in order]
    first = data[order.index(0)]  # document 0: 3 tokens, padded; its last token has no label
    assert first["input_ids"].tolist() == [1, 2, 3, 0, 0] and first["labels"].tolist() == [2, 3, -100, -100, -100]
    long = data[order.index(3)]  # document 3: 9 tokens cut to the window of 6
    assert long["input_ids"].tolist() == [31, 32, 33, 34, 35] and long["labels"].tolist() == [32, 33, 34, 35, 36]


def test_pack_until_overflow_joins_shuffled_documents_while_they_fit(tmp_path: Path) -> None:
    # RandomState(5).permutation(6) = [5, 2, 4, 1, 0, 3], sizes 1, 2, 4, 5, 3, 9 (cut to 6): 1 + 2 = 3 fits,
    # + 4 = 7 overflows, so 4 starts the next sample; 4 + 5, 5 + 3 and 3 + 6 overflow too
    assert np.random.RandomState(5).permutation(6).tolist() == [5, 2, 4, 1, 0, 3]
    groups = [[5, 2], [4], [1], [0], [3]]
    data = WholeDocumentDataset(
        write(tmp_path / "d", DOCUMENTS), "train", (0, 6), None, FORMAT, 5, "pack_until_overflow"
    )
    order = read_order(5, 6, 5, shuffled_documents=True)
    assert [data.sample_documents(k) for k in range(5)] == [groups[n] for n in order]
    joined = data[order.index(0)]  # documents 5 then 2: 51, 21, 22, then padding
    assert joined["input_ids"].tolist() == [51, 21, 22, 0, 0] and joined["labels"].tolist() == [
        21,
        22,
        -100,
        -100,
        -100,
    ]


def test_more_samples_than_an_epoch_continue_with_the_next_epochs_shuffle(tmp_path: Path) -> None:
    indexed = write(tmp_path / "d", DOCUMENTS)
    one = WholeDocumentDataset(indexed, "train", (0, 6), None, FORMAT, 5, "pack_until_overflow")
    three = WholeDocumentDataset(indexed, "train", (0, 6), 14, FORMAT, 5, "pack_until_overflow")
    assert len(three) == 14 and [three.sample_documents(k) for k in range(5)] == [
        one.sample_documents(k) for k in range(5)
    ]
    later = [three.sample_documents(k) for k in range(5, 14)]
    assert sorted(d for sample in later for d in sample).count(0) >= 1  # every epoch holds every document
    with pytest.raises(IndexError):
        three.sample_documents(14)


def test_allow_chopped_false_leaves_long_documents_out(tmp_path: Path) -> None:
    data = WholeDocumentDataset(
        write(tmp_path / "d", DOCUMENTS), "train", (1, 6), None, FORMAT, 5, "unpacked", allow_chopped=False
    )
    assert sorted(data.sample_documents(k)[0] for k in range(len(data))) == [1, 2, 4, 5]  # 3 holds 9 > 6 tokens
    with pytest.raises(
        DataError,
        match=r"the train split holds no document of at most seq_length \+ 1 = 6 tokens "
        r"\(allow_chopped: false\)",
    ):
        WholeDocumentDataset(
            write(tmp_path / "e", [[1] * 9]), "train", (0, 1), None, FORMAT, 5, "unpacked", allow_chopped=False
        )


def test_label_files_give_the_labels_and_documents_without_any_are_left_out(tmp_path: Path) -> None:
    indexed = write(tmp_path / "d", DOCUMENTS)
    with IndexedDatasetWriter(tmp_path / "l", np.int32) as writer:
        for d, document in enumerate(DOCUMENTS):
            writer.add_document([-100] * len(document) if d == 2 else [-100, *(t + 500 for t in document[1:])])
    labels = IndexedDataset(tmp_path / "l")
    data = WholeDocumentDataset(indexed, "train", (0, 6), None, FORMAT, 5, "unpacked", labels=labels)
    held = [data.sample_documents(k)[0] for k in range(len(data))]
    assert sorted(held) == [0, 1, 3, 4]  # the labels of documents 2 and 5 (one token) are all -100
    sample = data[held.index(1)]  # labels: the label file's, shifted like the tokens; -100 and padding untrained
    assert sample["input_ids"].tolist() == [11, 12, 13, 14, 15] and sample["labels"].tolist() == [
        512,
        513,
        514,
        515,
        -100,
    ]


def test_an_id_beyond_the_vocabulary_names_its_document(tmp_path: Path) -> None:
    fmt = SampleFormat(seq_length=5, eod_id=0, vocab_size=50)
    data = WholeDocumentDataset(write(tmp_path / "d", DOCUMENTS), "train", (0, 6), None, fmt, 5, "unpacked")
    with pytest.raises(DataError, match=r"d.bin: document 5 holds token id 51, beyond the vocabulary of 50 ids"):
        data[[data.sample_documents(k) for k in range(6)].index([5])]
