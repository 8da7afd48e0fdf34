"""Online RL's training rows: each sampled completion after its prompt, with the labels it is trained on.

A rollout's sequences differ in length (a completion ends at its end-of-document token or its limit), so rows of one
sequence each, padded to the longest, are mostly padding. Packed (where a document computes in a row as alone), the
sequences share rows of the same width by best-fit decreasing, each from its own start: `position_ids` restart,
`document_ids` number the sequences in their given order (what per-sequence values such as advantages are indexed
by) and a row's padded tail is one more document, numbered after them. A forward then costs the real tokens, and
attention within each sequence the same as alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .samples import IGNORE_INDEX
from .sft import pack_best_fit


def completion_rows(
    sequences: Sequence[Sequence[int]],
    labels: Sequence[Sequence[int]],
    *,
    width: int,
    pad_id: int,
    packed: bool,
) -> dict[str, torch.Tensor]:
    """`input_ids`, `labels` and `position_ids` (rows, `width`), and with `packed` `document_ids`: one sequence a
    row, or best-fit decreasing into as few rows as hold them. `labels[i][t]` is what position t of sequence i
    predicts (IGNORE_INDEX where nothing), as long as the sequence; each sequence fits `width`."""
    lengths = [len(sequence) for sequence in sequences]
    if max(lengths, default=0) > width:
        raise ValueError(f"completion rows: expected sequences of at most {width} tokens, found {max(lengths)}")
    rows = pack_best_fit(np.asarray(lengths), width) if packed else [[index] for index in range(len(lengths))]
    shape = (len(rows), width)
    ids = torch.full(shape, pad_id, dtype=torch.long)
    targets = torch.full(shape, IGNORE_INDEX, dtype=torch.long)
    positions = torch.arange(width).repeat(len(rows), 1)
    documents = torch.full(shape, len(sequences), dtype=torch.long)
    for row, members in enumerate(rows):
        start = 0
        for index in members:
            span = slice(start, start + lengths[index])
            ids[row, span] = torch.tensor(sequences[index], dtype=torch.long)
            targets[row, span] = torch.tensor(labels[index], dtype=torch.long)
            positions[row, span] = torch.arange(lengths[index])
            documents[row, span] = index
            start += lengths[index]
        if packed:  # the tail: a document of its own
            positions[row, start:] = torch.arange(width - start)
    laid_out = {"input_ids": ids, "labels": targets, "position_ids": positions}
    return laid_out | ({"document_ids": documents} if packed else {})
