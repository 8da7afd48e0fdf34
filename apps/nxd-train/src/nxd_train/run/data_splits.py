"""The datasets a run trains, validates and tests on, with what the loop needs to know of them: how samples
become micro-batches, the vocabulary, the tokenizer's files and identity."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from nxd_data import TextTokenizer, collate, collate_packed_pairs, collate_pairs, collate_prompts
from torch.utils.data import Dataset

Sample = dict[str, torch.Tensor]


@dataclass(frozen=True)
class DataSplits:
    train: Dataset
    validation: Dataset | None
    test: Dataset | None
    padding: dict[str, torch.Tensor]
    """A sample that adds nothing to the loss (fills a short evaluation batch)."""
    vocab_size: int
    """Tokens the tokenizer can produce (the model's vocabulary must hold at least this many)."""
    tokenizer: str
    shuffled: bool
    """The dataset is already in a shuffled order (Megatron's shuffle index): the sampler reads it in order."""
    notes: tuple[str, ...] = ()
    """What the run should tell about its data (records skipped, fill of packed rows ...)."""
    tokenizer_files: dict[str, str] = field(default_factory=dict)
    """The tokenizer's files (name -> path), which a Hugging Face export copies beside the weights."""
    tokenizer_fingerprint: str | None = None
    """The tokenizer's identity (its vocabulary, merges and special ids), which a resume must keep; None for
    data already tokenised."""
    rows_per_sample: int = 1
    """Sequences per sample: 2 for preference pairs (chosen and rejected, collated onto adjacent rows)."""
    trained_rows_per_sample: int | None = None
    """Sequences per sample a step trains on, when fewer than rows_per_sample (KTO's KL sequence only
    goes through a forward without gradients); None: all of them."""
    pad_id: int | None = None
    """The id rows are padded with, where a reward model's export must name it (transformers' sequence
    classifiers read the score at the last other token)."""
    reference_in_data: bool = False
    """Every sample carries its reference log-probs (precomputed files): no reference model runs."""

    packed_pairs: bool = False
    """A reward model's micro-batches are packed into one row, where the layout lets them."""
    padded_rows: bool = False
    """Rows are records padded to seq_length (SFT): a micro-batch drops the padding columns after its longest."""
    text_tokenizer: TextTokenizer | None = None
    """The tokenizer itself, where the run samples text of its own (online RL's prompts)."""

    def collate(self, trim_to: int | None, packable: bool = False) -> Callable[[list[Sample]], Sample]:
        """How samples become a micro-batch; pairs drop their trailing padding columns (to a multiple of
        `trim_to`, None keeps every column: pipeline stages pass one shape), as do padded SFT records
        (`padded_rows`), or with `packed_pairs`,
        where the layout is `packable`, are packed into one row of a multiple of `trim_to`."""
        if self.text_tokenizer is not None:  # prompts: the rollouts make each micro-batch's rows
            return collate_prompts
        if self.rows_per_sample != 2:
            return partial(collate, trim_to=trim_to) if self.padded_rows and trim_to is not None else collate
        if self.packed_pairs and packable and trim_to is not None:
            return partial(collate_packed_pairs, multiple_of=trim_to)
        return partial(collate_pairs, trim_to=trim_to)


def record_splits(
    train: Dataset,
    validation: Dataset | None,
    tokenizer: TextTokenizer,
    name: str,
    cache_dir: Path,
    notes: tuple[str, ...],
    test: Dataset | None = None,
    **extra: Any,
) -> DataSplits:
    """The splits of records (or documents) a tokenizer read, `tokenizer` (named `name`), whose files an export
    copies from `cache_dir`."""
    return DataSplits(
        train,
        validation,
        test,
        train.padding(),
        tokenizer.vocab_size,
        name,
        shuffled=False,
        notes=notes,
        tokenizer_files=tokenizer.export_files(cache_dir / "tokenizers"),
        tokenizer_fingerprint=tokenizer.fingerprint,
        **extra,
    )
