"""The dataset factory: what `data.*` asks for, as train / validation / test datasets of token windows.

This release reads the built-in corpus (corpus.py); Megatron indexed datasets and Hugging Face data
arrive with nxd-data behind the same `build_datasets` seam, and the keys that select them are
rejected by name until then.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from nxd_config.schema.data import DataConfig
from torch.utils.data import Dataset

from .corpus import builtin_tokenizer, load_tokenizer, stdlib_corpus, tokenize_corpus

IGNORE_INDEX = -100

NOT_IN_THIS_RELEASE = {
    "data_prefix": "Megatron indexed datasets",
    "index_mapping_dir": "Megatron indexed datasets",
    "data_impl": "Megatron indexed datasets",
    "skip_warmup": "Megatron indexed datasets",
    "reset_attention_mask": "document-wise attention masks",
    "pad_samples_to_global_batch_size": "padded global batches",
    "train_dir": "Hugging Face datasets",
    "val_dir": "Hugging Face datasets",
    "dev_choose_samples": "Hugging Face datasets",
    "use_sft_style_data_module": "Hugging Face datasets",
}
"""data keys whose feature arrives with nxd-data: setting one is an error, never a silent no-op."""


def unavailable_data_keys(data: DataConfig) -> list[str]:
    """One message per data key the user set whose feature this release does not have."""
    messages = [
        f"data.{key}: {feature} are not in this release (nxd-data adds them); remove the key to "
        f"pretrain on the built-in corpus"
        for key, feature in NOT_IN_THIS_RELEASE.items()
        if data.is_set(key)
    ]
    if data.tokenizer is not None and data.tokenizer.library != "huggingface":
        messages.append(
            f"data.tokenizer.library: expected huggingface in this release (nxd-data adds the others), "
            f"found {data.tokenizer.library!r}"
        )
    if data.tokenizer is not None and data.tokenizer.type is None:
        messages.append("data.tokenizer.type: expected a tokenizer.json file or a tokenizer directory, found null")
    return messages


class TokenWindows(Dataset):
    """Consecutive windows of a token stream: sample i holds seq_length + 1 tokens starting at
    i * seq_length (neighbours overlap by one), as Megatron's GPT dataset samples them."""

    def __init__(self, tokens: np.ndarray, first: int, count: int, seq_length: int, eod_id: int,
                 *, plus_one: bool = True, eod_mask_loss: bool = False, reset_position_ids: bool = False):  # fmt: skip
        self.tokens, self.first, self.count, self.seq_length, self.eod_id = tokens, first, count, seq_length, eod_id
        self.plus_one, self.eod_mask_loss, self.reset_position_ids = plus_one, eod_mask_loss, reset_position_ids

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = (self.first + index) * self.seq_length
        length = self.seq_length + 1 if self.plus_one else self.seq_length
        window = torch.from_numpy(self.tokens[start : start + length].astype(np.int64))
        input_ids = window[: self.seq_length]
        labels = window[1:].clone()
        if not self.plus_one:  # the last position has no next token inside the sample
            labels = torch.cat([labels, torch.tensor([IGNORE_INDEX])])
        if self.eod_mask_loss:
            labels[labels == self.eod_id] = IGNORE_INDEX
        position_ids = torch.arange(self.seq_length)
        if self.reset_position_ids:
            for end in (input_ids == self.eod_id).nonzero().flatten().tolist():
                position_ids[end + 1 :] -= position_ids[end + 1].clone()
        return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}


@dataclass(frozen=True)
class DataSplits:
    train: TokenWindows
    validation: TokenWindows
    test: TokenWindows
    vocab_size: int
    """Tokens the tokenizer can produce (the model's vocabulary must hold at least this many)."""
    tokenizer: str


def _split_counts(total: int, splits_string: str) -> tuple[int, int, int]:
    weights = [float(part) for part in splits_string.replace("/", ",").split(",")]
    weights += [0.0] * (3 - len(weights))
    bounds = np.cumsum([0.0] + [w / sum(weights) for w in weights]) * total
    edges = [round(bound) for bound in bounds]
    return edges[1] - edges[0], edges[2] - edges[1], edges[3] - edges[2]


def build_datasets(data: DataConfig, seq_length: int, cache_dir: Path) -> DataSplits:
    """The run's datasets (today: the built-in corpus split by `splits_string`)."""
    corpus = stdlib_corpus()
    if data.tokenizer is not None:
        tokenizer, name = load_tokenizer(data.tokenizer.type), data.tokenizer.type
    else:
        tokenizer, name = builtin_tokenizer(corpus, cache_dir), "built-in byte-level BPE (4096 tokens)"
    eod_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    if eod_id is None:
        raise ValueError(f"data.tokenizer.type: {name} has no end-of-sequence token to separate documents")
    tokens = tokenize_corpus(corpus, tokenizer, eod_id, cache_dir)
    windows = (len(tokens) - 1) // seq_length
    train, validation, test = _split_counts(windows, data.splits_string)
    options = dict(plus_one=not data.no_seqlen_plus_one_input_tokens, eod_mask_loss=data.eod_mask_loss,
                   reset_position_ids=data.reset_position_ids)  # fmt: skip
    return DataSplits(
        train=TokenWindows(tokens, 0, train, seq_length, eod_id, **options),
        validation=TokenWindows(tokens, train, validation, seq_length, eod_id, **options),
        test=TokenWindows(tokens, train + validation, test, seq_length, eod_id, **options),
        vocab_size=len(tokenizer),
        tokenizer=name,
    )


def collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([sample[key] for sample in samples]) for key in samples[0]}
