"""KTO data: unpaired examples, each a prompt and one completion labelled desirable or not -> one
sample per example holding two sequences, the example and its mismatched KL sequence.

Records (jsonl or Hugging Face data) are `{"prompt", "completion", "label"}`, `label` a JSON boolean
(true: desirable), prompt and completion strings or, conversationally, message lists rendered with the
tokenizer's chat template (as DPO records are). Tokens are BOS + prompt, then completion + EOS, labels
on the completion only.

KTO's KL baseline compares policy and reference on completions that do not answer their prompt: each
example's KL sequence is its prompt with the completion of the nearest earlier record (cyclically, in
file order) whose prompt differs, fixed once for the data set, so a reference table can hold it.
Samples are shaped as preference pairs (row 0 the example, row 1 its KL sequence; nxd-data's
`collate_pairs` puts them on adjacent rows), with `kto_label` per row. An over-long example is cut as
a preference pair is (`max_prompt_length`, `truncation_mode`), on its own; its KL completion is then
cut to the room its prompt leaves.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .chat import ChatRenderer
from .errors import DataError
from .preference import PreferenceDataset, PreferencePair, check_truncation, record_texts, truncated_pair
from .sft import read_records
from .tokenizer import TextTokenizer

LABEL_KEY = "kto_label"


def _examples(
    records: Iterator[tuple[str, Any]], tokenizer: TextTokenizer, where: str
) -> tuple[list[list[int]], list[list[int]], list[bool]]:
    """Prompt tokens, completion tokens (with EOS) and labels of every record."""
    renderer = ChatRenderer(tokenizer) if tokenizer.chat_template is not None else None
    prompts, completions, labels = [], [], []
    for place, record in records:
        prompt, (completion,), conversation = record_texts(record, place, where, renderer, ("completion",))
        if not isinstance(record.get("label"), bool):
            found = "no label" if "label" not in record else f"{type(record['label']).__name__} {record['label']!r}"
            raise DataError(
                f"{where}: {place}: label: expected true (a desirable completion) or false (an "
                f"undesirable one), found {found}"
            )
        ids = tokenizer.encode([prompt, completion])
        prompts.append(ids[0] if conversation else [tokenizer.begin_id, *ids[0]])  # the template writes its BOS
        completions.append([*ids[1], tokenizer.eod_id])
        labels.append(record["label"])
    if not prompts:
        raise DataError(f"{where}: holds no records")
    return prompts, completions, labels


def mismatched(prompts: list[list[int]], where: str) -> list[int]:
    """For each record, the record whose completion makes its KL sequence: the nearest earlier one,
    cyclically, with a different prompt (DataError naming `where` when every prompt is the same)."""
    keys = [tuple(prompt) for prompt in prompts]
    if len(set(keys)) < 2:
        raise DataError(
            f"{where}: KTO's KL baseline pairs each prompt with another prompt's completion; expected "
            f"at least two different prompts, found {len(set(keys))} in {len(keys)} records"
        )
    chosen = []
    for index, key in enumerate(keys):
        other = (index - 1) % len(keys)
        while keys[other] == key:
            other = (other - 1) % len(keys)
        chosen.append(other)
    return chosen


class KTODataset(Dataset):
    """One sample per example: `input_ids`, `labels`, `position_ids` of shape (2, seq_length) (the
    example, then its KL sequence) and `kto_label` (2,) (1.0 desirable, 0.0 not, on both rows)."""

    def __init__(self, pairs: list[PreferencePair], labels: list[bool], seq_length: int, pad_id: int):
        self.rows = PreferenceDataset(pairs, seq_length, pad_id)
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def truncated(self) -> int:
        return self.rows.truncated

    def lengths(self) -> list[int]:
        """Each sample's longer sequence in tokens (how many columns it needs)."""
        return self.rows.lengths()

    @property
    def desirable(self) -> int:
        return sum(self.labels)

    @functools.cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the sequences and the labels: equal exactly when the samples are."""
        labels = np.asarray(self.labels, dtype=np.int8).tobytes()
        return hashlib.sha256(f"kto {self.rows.fingerprint} ".encode() + labels).hexdigest()

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        label = float(self.labels[int(index)])
        return self.rows[index] | {LABEL_KEY: torch.full((2,), label, dtype=torch.float64)}

    def padding(self) -> dict[str, torch.Tensor]:
        """An example that adds nothing to the loss or to the KL baseline."""
        return self.rows.padding() | {LABEL_KEY: torch.zeros(2, dtype=torch.float64)}


def kto_dataset(
    location: str,
    where: str,
    split: str,
    tokenizer: TextTokenizer,
    seq_length: int,
    *,
    max_prompt_length: int,
    truncation_mode: str = "keep_start",
    limit: int | None = None,
    need_both: bool = True,
) -> KTODataset:
    """The KTO examples of the data at `location` (see the module docstring); with `need_both`, a
    DataError unless both desirable and undesirable examples are present."""
    check_truncation(seq_length, max_prompt_length, truncation_mode)
    prompts, completions, labels = _examples(read_records(location, where, split, limit), tokenizer, where)
    desirable = sum(labels)
    if need_both and desirable in (0, len(labels)):
        raise DataError(
            f"{where}: KTO learns from both kinds of example; expected desirable (label true) and "
            f"undesirable (label false) completions, found {desirable} desirable and "
            f"{len(labels) - desirable} undesirable"
        )
    pairs = []
    for prompt, completion, other in zip(prompts, completions, mismatched(prompts, where), strict=True):
        example = truncated_pair(prompt, completion, completion, seq_length, max_prompt_length, truncation_mode)
        kl = completions[other][: seq_length - len(example.prompt)]  # cut to the example's prompt, not the reverse
        pairs.append(replace(example, rejected=kl))
    return KTODataset(pairs, labels, seq_length, tokenizer.eod_id)
