"""One training sample of causal language modelling, from a window of tokens."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

IGNORE_INDEX = -100
"""Label of positions that do not count in the loss (transformers' and torch's convention)."""


@dataclass(frozen=True)
class SampleFormat:
    """How a token window becomes model inputs (the `data.*` keys of Megatron's GPT dataset)."""

    seq_length: int
    eod_id: int
    plus_one: bool = True
    """Windows hold seq_length + 1 tokens (labels are the inputs shifted by one); False: seq_length
    tokens, and the last position has no label (`no_seqlen_plus_one_input_tokens`)."""
    eod_mask_loss: bool = False
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    """Add `document_ids` (how many end-of-document tokens precede each position), so the model
    confines attention to each document as Megatron's get_ltor_masks_and_position_ids does."""
    vocab_size: int | None = None
    """The tokenizer's ids: a stored token at or beyond it is refused where it is read, naming the file
    and document (None: not checked)."""

    @property
    def window(self) -> int:
        return self.seq_length + 1 if self.plus_one else self.seq_length

    def sample(self, window: np.ndarray, label_window: np.ndarray | None = None) -> dict[str, torch.Tensor]:
        """input_ids, labels and position_ids of one window; a short window (the end of a document
        list) is padded with ignored labels. `label_window`, the same span of a label file, gives the
        labels in place of the shifted tokens (a negative label is not trained on), as GPT-NeoX reads
        its label data."""
        tokens = torch.from_numpy(np.asarray(window, dtype=np.int64))
        length = min(len(tokens), self.window)
        padded = torch.full((self.window,), self.eod_id, dtype=torch.int64)
        padded[:length] = tokens[:length]
        input_ids = padded[: self.seq_length]
        if label_window is not None:
            padded = torch.full((self.window,), IGNORE_INDEX, dtype=torch.int64)
            padded[:length] = torch.from_numpy(np.asarray(label_window[:length], dtype=np.int64))
            padded[padded < 0] = IGNORE_INDEX
        labels = torch.full((self.seq_length,), IGNORE_INDEX, dtype=torch.int64)
        labels[: self.window - 1] = padded[1:]
        labels[max(length - 1, 0) :] = IGNORE_INDEX
        if self.eod_mask_loss:
            labels[labels == self.eod_id] = IGNORE_INDEX
        position_ids = torch.arange(self.seq_length)
        if self.reset_position_ids:  # Megatron's get_ltor_masks_and_position_ids
            previous = 0
            for end in input_ids[:length].eq(self.eod_id).nonzero().flatten().tolist():
                position_ids[end + 1 :] -= end + 1 - previous
                previous = end + 1
        sample = {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}
        if self.reset_attention_mask:
            ends = input_ids.eq(self.eod_id).long()
            sample["document_ids"] = torch.cat([torch.zeros(1, dtype=torch.int64), ends[:-1].cumsum(0)])
        return sample

    def padding(self) -> dict[str, torch.Tensor]:
        """A sample that adds nothing to the loss (`pad_samples_to_global_batch_size`)."""
        return self.sample(np.empty(0, dtype=np.int64))


def collate(samples: list[dict[str, torch.Tensor]], trim_to: int | None = None) -> dict[str, torch.Tensor]:
    """Stack samples into a batch, key by key; with `trim_to`, without its trailing padding columns
    (`trim_padding`), as dynamic padding pads a batch to its longest sequence only."""
    batch = {key: torch.stack([sample[key] for sample in samples]) for key in samples[0]}
    return batch if trim_to is None else trim_padding(batch, trim_to)


def trim_padding(batch: dict[str, torch.Tensor], trim_to: int) -> dict[str, torch.Tensor]:
    """`batch` without the columns after its last label (rounded up to a multiple of `trim_to`): they are
    padding, which causal attention keeps from every real token, so nothing else changes."""
    counted = (batch["labels"] != IGNORE_INDEX).any(0).nonzero()
    length = int(counted.max()) + 2 if len(counted) else 1  # through the last label's input and its target
    length = min(-(-length // trim_to) * trim_to, batch["labels"].shape[-1])
    return {key: value[..., :length] if value.dim() > 1 else value for key, value in batch.items()}
