"""Preference data (DPO, ORPO): records of a prompt and a chosen and a rejected response -> one sample
per pair holding both sequences, so that a pair always lands in one micro-batch.

Records come from jsonl (plain, .gz, .zst) or Hugging Face data, in one of two forms:
- `{"prompt": str, "chosen": str, "rejected": str}`: tokens are BOS + prompt, then each response + EOS;
- the conversational form, `prompt` a list of messages and `chosen` / `rejected` lists of the
  assistant's messages: the prompt is rendered with the tokenizer's chat template and its generation
  prompt, each response as the rest of the conversation it completes, then EOS.

Labels are ignored over the prompt. When prompt + the longer response exceeds `seq_length`, the
prompt is cut to `max_prompt_length` tokens (`truncation_mode` keep_start keeps its start, keep_end its
end, BOS kept), then each response to the room left (its start kept), so prompt + response never
exceeds `seq_length`.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .chat import ChatRenderer, message_problem
from .errors import DataError
from .samples import IGNORE_INDEX, trim_padding
from .sft import read_records
from .tokenizer import TextTokenizer

TRUNCATION_MODES = ("keep_start", "keep_end")
RESPONSES = ("chosen", "rejected")


@dataclass(frozen=True)
class PreferencePair:
    prompt: list[int]
    chosen: list[int]
    rejected: list[int]
    truncated: bool = False
    margin: float = 0.0
    """How far the chosen response should score above the rejected one (a reward model's; TRL's `margin`)."""


def record_texts(
    record: Any, place: str, where: str, renderer: ChatRenderer | None, responses: tuple[str, ...] = RESPONSES
) -> tuple[str, list[str], bool]:
    """The prompt and `responses` texts of a record (strings, or a conversation rendered with the chat
    template: the prompt with its generation prompt, each response as the rest of the conversation it
    completes), and whether they came from a conversation."""
    names = ("prompt", *responses)
    listed = ", ".join(names[:-1]) + " and " + names[-1]
    if not isinstance(record, dict):
        raise DataError(f"{where}: {place}: expected a JSON object, found {type(record).__name__}")
    if missing := [name for name in names if name not in record]:
        raise DataError(
            f"{where}: {place}: expected {listed}, found no {', '.join(missing)} "
            f"(keys: {', '.join(sorted(record)) or 'none'})"
        )
    if all(isinstance(record[name], str) for name in names):
        for name in responses:
            if not record[name].strip():
                raise DataError(f"{where}: {place}: {name}: expected a response, found an empty string")
        return record["prompt"], [record[name] for name in responses], False
    if not all(isinstance(record[name], list) for name in names):
        kinds = ", ".join(f"{name} {type(record[name]).__name__}" for name in names)
        raise DataError(f"{where}: {place}: expected {listed} all strings or all message lists, found {kinds}")
    if renderer is None:
        raise DataError(
            f"{where}: {place}: a conversational record needs the tokenizer's chat template, which it "
            "lacks (expected chat_template in tokenizer_config.json or a chat_template.jinja file)"
        )
    prompt = renderer.render(record["prompt"], generation_prompt=True)
    texts = []
    for name in responses:
        messages = [*record["prompt"], *record[name]]
        if problem := message_problem(messages):
            raise DataError(f"{where}: {place}: prompt + {name}: {problem}")
        if not any(m["role"] == "assistant" and m["content"].strip() for m in record[name]):
            raise DataError(f"{where}: {place}: {name}: expected an assistant message with content, found none")
        whole = renderer.render(messages)
        if not whole.startswith(prompt):
            raise DataError(
                f"{where}: {place}: the chat template does not render the prompt as the start of the "
                "conversation; expected a template whose prefixes render as prefixes"
            )
        texts.append(whole[len(prompt) :])
    return prompt, texts, True


def truncated_pair(
    prompt: list[int], chosen: list[int], rejected: list[int], seq_length: int, max_prompt_length: int, mode: str
) -> PreferencePair:
    """The pair cut as the module docstring says."""
    if len(prompt) + max(len(chosen), len(rejected)) <= seq_length:
        return PreferencePair(prompt, chosen, rejected)
    if len(prompt) > max_prompt_length:
        prompt = (
            prompt[:max_prompt_length]
            if mode == "keep_start"
            else [prompt[0], *prompt[len(prompt) - max_prompt_length + 1 :]]
        )
    room = seq_length - len(prompt)
    return PreferencePair(prompt, chosen[:room], rejected[:room], truncated=True)


def _margin(record: dict[str, Any], place: str, where: str) -> float:
    """The record's optional `margin` (a number; 0 without one)."""
    margin = record.get("margin", 0.0)
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not np.isfinite(margin):
        raise DataError(
            f"{where}: {place}: margin: expected a finite number (how far chosen should score above "
            f"rejected), found {margin!r}"
        )
    return float(margin)


def tokenize_pairs(
    records: Iterator[tuple[str, Any]],
    tokenizer: TextTokenizer,
    seq_length: int,
    max_prompt_length: int,
    truncation_mode: str,
    where: str,
    margins: bool = False,
) -> list[PreferencePair]:
    """Every record as token lists (see the module docstring), with its `margin` when `margins` (a
    reward model's data); a DataError names the first bad record."""
    renderer = ChatRenderer(tokenizer) if tokenizer.chat_template is not None else None
    pairs = []
    for place, record in records:
        prompt, (chosen, rejected), conversation = record_texts(record, place, where, renderer)
        ids = tokenizer.encode([prompt, chosen, rejected])
        prompt_ids = ids[0] if conversation else [tokenizer.begin_id, *ids[0]]  # the template writes its own BOS
        pair = truncated_pair(
            prompt_ids,
            [*ids[1], tokenizer.eod_id],
            [*ids[2], tokenizer.eod_id],
            seq_length,
            max_prompt_length,
            truncation_mode,
        )
        pairs.append(replace(pair, margin=_margin(record, place, where)) if margins else pair)
    if not pairs:
        raise DataError(f"{where}: holds no records")
    return pairs


class PreferenceDataset(Dataset):
    """One sample per pair: `input_ids`, `labels` and `position_ids` of shape (2, seq_length), the
    chosen sequence first, padded; labels ignored over the prompt and the padding. With `scores`
    (a reward model's data) also `score_position` (2,), each row's last token that is not padding,
    and `margin` (2,), the pair's margin on both rows."""

    def __init__(self, pairs: list[PreferencePair], seq_length: int, pad_id: int, scores: bool = False):
        self.pairs, self.seq_length, self.pad_id, self.scores = pairs, seq_length, pad_id, scores

    def __len__(self) -> int:
        return len(self.pairs)

    @property
    def truncated(self) -> int:
        return sum(pair.truncated for pair in self.pairs)

    def lengths(self) -> list[int]:
        """Each sample's longer sequence in tokens (how many columns it needs)."""
        return [len(pair.prompt) + max(len(pair.chosen), len(pair.rejected)) for pair in self.pairs]

    @functools.cached_property
    def fingerprint(self) -> str:
        """SHA-256 of every pair's tokens, in order, and the row length: equal exactly when the samples are."""
        digest = hashlib.sha256(f"{self.seq_length} {self.pad_id}".encode())
        for pair in self.pairs:
            for tokens in (pair.prompt, pair.chosen, pair.rejected):
                digest.update(np.asarray(tokens, dtype=np.int64).tobytes() + b"|")
        if self.scores:
            digest.update(b"scores" + np.asarray([pair.margin for pair in self.pairs], dtype=np.float64).tobytes())
        return digest.hexdigest()

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        pair = self.pairs[int(index)]
        return self._sample(pair.prompt, (pair.chosen, pair.rejected), pair.margin)

    def padding(self) -> dict[str, torch.Tensor]:
        """A pair that adds nothing to the loss (fills a short evaluation batch)."""
        return self._sample([], ([], []))

    def _sample(
        self, prompt: list[int], responses: tuple[list[int], list[int]], margin: float = 0.0
    ) -> dict[str, torch.Tensor]:
        seq = self.seq_length
        input_ids = np.full((2, seq), self.pad_id, dtype=np.int64)
        labels = np.full((2, seq), IGNORE_INDEX, dtype=np.int64)
        for row, response in enumerate(responses):
            tokens = [*prompt, *response]
            input_ids[row, : len(tokens)] = tokens
            labels[row, len(prompt) - 1 : len(tokens) - 1] = response  # position t predicts token t + 1
        positions = np.broadcast_to(np.arange(seq), (2, seq)).copy()
        sample = {
            "input_ids": torch.from_numpy(input_ids),
            "labels": torch.from_numpy(labels),
            "position_ids": torch.from_numpy(positions),
        }
        if self.scores:  # where transformers' sequence classifiers read: the last id that is not padding
            real = input_ids != self.pad_id
            last = np.where(real.any(-1), seq - 1 - np.argmax(real[:, ::-1], axis=-1), 0)
            sample |= {
                "score_position": torch.from_numpy(last.astype(np.int64)),
                "margin": torch.full((2,), margin, dtype=torch.float64),
            }
        return sample


def check_truncation(seq_length: int, max_prompt_length: int, truncation_mode: str) -> None:
    """DataError unless the prompt limit leaves room for a response and the mode is known."""
    if truncation_mode not in TRUNCATION_MODES:
        raise DataError(f"truncation_mode: expected one of {', '.join(TRUNCATION_MODES)}, found {truncation_mode!r}")
    if not 1 <= max_prompt_length < seq_length:
        raise DataError(
            f"max_prompt_length: expected at least 1 and below data.seq_length ({seq_length}) so that a "
            f"response has room, found {max_prompt_length}"
        )


def preference_dataset(
    location: str,
    where: str,
    split: str,
    tokenizer: TextTokenizer,
    seq_length: int,
    *,
    max_prompt_length: int,
    truncation_mode: str = "keep_start",
    limit: int | None = None,
    scores: bool = False,
) -> PreferenceDataset:
    """The preference pairs of the data at `location` (see the module docstring); `scores` for a
    reward model (see `PreferenceDataset`)."""
    check_truncation(seq_length, max_prompt_length, truncation_mode)
    pairs = tokenize_pairs(
        read_records(location, where, split, limit),
        tokenizer,
        seq_length,
        max_prompt_length,
        truncation_mode,
        where,
        margins=scores,
    )
    return PreferenceDataset(pairs, seq_length, tokenizer.eod_id, scores)


def collate_pairs(samples: list[dict[str, torch.Tensor]], trim_to: int | None = None) -> dict[str, torch.Tensor]:
    """Pair samples -> one batch of sequences, each pair's chosen and rejected on adjacent rows
    (2i chosen, 2i + 1 rejected), so a model sees ordinary rows and a pair never splits; per-row values
    (a sample's entries of shape (2,)) become one value per row. With
    `trim_to`, the columns after the batch's longest sequence (rounded up to a multiple of `trim_to`)
    are dropped: they are padding, which causal attention keeps from every real token."""
    batch = {key: torch.stack([sample[key] for sample in samples]).flatten(0, 1) for key in samples[0]}
    return batch if trim_to is None else trim_padding(batch, trim_to)


def collate_packed_pairs(samples: list[dict[str, torch.Tensor]], multiple_of: int = 8) -> dict[str, torch.Tensor]:
    """A reward model's pair samples -> one row holding every sequence without padding (chosen 0,
    rejected 0, chosen 1 ... as `collate_pairs` orders them), each from its own start: `position_ids`
    restart per sequence and `document_ids` number the sequences, so attention stays within each
    (the row's tail, token id 0 to a multiple of `multiple_of`, is one more document, numbered after
    the sequences). `score_position`
    and `margin` stay one value per sequence. A sequence runs through its score position (its last
    token that is not padding, or for GPT-NeoX's documents its last labelled one: nothing after it
    changes the score); a padding pair's sequences (no labels on either) are empty."""
    batch = {key: torch.stack([sample[key] for sample in samples]).flatten(0, 1) for key in samples[0]}
    real = (batch["labels"] != IGNORE_INDEX).any(-1).view(-1, 2).any(-1).repeat_interleave(2)  # not a padding pair
    lengths = torch.where(real, batch["score_position"] + 1, 0)
    total = int(lengths.sum())
    width = max(-(-total // multiple_of) * multiple_of, multiple_of)
    rows = len(lengths)
    packed = {
        "input_ids": torch.zeros(1, width, dtype=torch.int64),
        "labels": torch.full((1, width), IGNORE_INDEX, dtype=torch.int64),
        "position_ids": torch.zeros(1, width, dtype=torch.int64),
        "document_ids": torch.full((1, width), rows, dtype=torch.int64),
    }
    start = 0
    for row, length in enumerate(lengths.tolist()):
        span = slice(start, start + length)
        for key in ("input_ids", "labels", "position_ids"):
            packed[key][0, span] = batch[key][row, :length]
        packed["document_ids"][0, span] = row
        start += length
    packed["position_ids"][0, start:] = torch.arange(width - start)
    return packed | {key: value for key, value in batch.items() if value.dim() == 1}
