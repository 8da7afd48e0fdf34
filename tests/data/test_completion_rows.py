"""Online RL's training rows: one sequence a row, or packed by best-fit decreasing as documents of rows."""

from __future__ import annotations

import pytest
import torch
from nxd_data import completion_rows

IGNORE = -100
SEQUENCES = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11, 12, 13, 14, 15, 16]]
LABELS = [[IGNORE, 3, 4, 5, IGNORE], [IGNORE, IGNORE], [IGNORE, 10, IGNORE], [IGNORE, IGNORE, 14, 15, 16, IGNORE]]


def test_one_sequence_a_row_padded_to_the_width():
    rows = completion_rows(SEQUENCES, LABELS, width=8, pad_id=0, packed=False)
    assert set(rows) == {"input_ids", "labels", "position_ids"}
    assert rows["input_ids"][1].tolist() == [6, 7, 0, 0, 0, 0, 0, 0]
    assert rows["labels"][3].tolist() == [*LABELS[3], IGNORE, IGNORE]
    assert rows["position_ids"].tolist() == [list(range(8))] * 4


def test_packed_sequences_share_rows_each_from_its_own_start():
    """Best-fit decreasing by hand, width 8: the 6-token sequence opens row 0, the 5-token one row 1, the 3-token one
    fills row 1 (room 3), the 2-token one fills row 0 (room 2); each row keeps its sequences in their order."""
    rows = completion_rows(SEQUENCES, LABELS, width=8, pad_id=0, packed=True)
    assert rows["input_ids"].tolist() == [[6, 7, 11, 12, 13, 14, 15, 16], [1, 2, 3, 4, 5, 8, 9, 10]]
    assert rows["document_ids"].tolist() == [[1, 1, 3, 3, 3, 3, 3, 3], [0, 0, 0, 0, 0, 2, 2, 2]]
    assert rows["position_ids"].tolist() == [[0, 1, 0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 0, 1, 2]]
    assert rows["labels"].tolist() == [[*LABELS[1], *LABELS[3]], [*LABELS[0], *LABELS[2]]]


def test_a_packed_rows_tail_is_a_document_of_its_own():
    rows = completion_rows(SEQUENCES[:2], LABELS[:2], width=8, pad_id=0, packed=True)
    assert rows["document_ids"].tolist() == [[0, 0, 0, 0, 0, 1, 1, 2]]
    assert rows["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 0]]
    assert rows["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 0]]
    assert rows["labels"][0, -1].item() == IGNORE


def test_a_sequence_wider_than_the_rows_is_refused():
    with pytest.raises(ValueError, match="at most 5 tokens, found 6"):
        completion_rows(SEQUENCES, LABELS, width=5, pad_id=0, packed=True)
    assert completion_rows([], [], width=4, pad_id=0, packed=True)["input_ids"].shape == torch.Size([0, 4])
