"""Prompt data of online RL (GRPO): records of a prompt and whatever else the rewards read (an answer ...).

Records come from jsonl (plain, .gz, .zst) or Hugging Face data. The prompt field holds a string (tokens: BOS +
its text) or a list of messages, rendered with the tokenizer's chat template and its generation prompt. Or they are
pre-tokenised documents with their label documents (GPT-NeoX's post-training data): a document's tokens before its
first labelled one are the prompt, its labelled tokens (less the end-of-document token) the record's `answer`. A
sample is one prompt, by its index and its split's number: the run samples its completions and reads the record
back for the rewards.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from .chat import ChatRenderer, message_problem
from .errors import DataError
from .indexed import IndexedDataset
from .samples import IGNORE_INDEX
from .sft import read_records
from .tokenizer import TextTokenizer

PROMPT_INDEX = "prompt_index"
"""A prompt sample's key: its index in the dataset (-1 for the padding that fills a short batch)."""
PROMPT_SPLIT = "prompt_split"
"""A prompt sample's key: its split's number (SPLITS), so that a step pass finds its record."""
SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    text: str | list[dict[str, Any]]
    """What the rewards see as the prompt: the string, or the messages."""
    record: dict[str, Any]
    place: str
    """Where the record is ("FILE line N"), for messages about it."""


class PromptDataset(Dataset):
    def __init__(self, prompts: list[Prompt], split: str = "train"):
        self.prompts, self.split = prompts, split

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {PROMPT_INDEX: torch.tensor(index), PROMPT_SPLIT: torch.tensor(SPLITS.index(self.split))}

    def padding(self) -> dict[str, torch.Tensor]:
        """The sample that fills a short batch: no prompt, no completions trained on."""
        return {PROMPT_INDEX: torch.tensor(-1), PROMPT_SPLIT: torch.tensor(SPLITS.index(self.split))}

    def lengths(self) -> list[int]:
        return [len(prompt.tokens) for prompt in self.prompts]

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for prompt in self.prompts:
            digest.update(json.dumps(prompt.tokens).encode())
        return digest.hexdigest()


def prompt_dataset(
    location: str,
    where: str,
    split: str,
    tokenizer: TextTokenizer,
    *,
    room: int,
    field: str = "prompt",
    limit: int | None = None,
) -> PromptDataset:
    """The prompts at `location`, each within `room` tokens (the sequence length less the longest completion); a
    DataError names the first bad record."""
    renderer = ChatRenderer(tokenizer) if tokenizer.chat_template is not None else None
    prompts = []
    for place, record in read_records(location, where, split, limit):
        text = _prompt_of(record, place, where, field)
        if isinstance(text, list):
            if renderer is None:
                raise DataError(
                    f"{where}: {place}: {field}: chat messages need the tokenizer's chat template, which it lacks "
                    "(expected chat_template in tokenizer_config.json or a chat_template.jinja file)"
                )
            tokens = tokenizer.encode([renderer.render(text, generation_prompt=True)])[0]  # the template's own BOS
        else:
            tokens = [tokenizer.begin_id, *tokenizer.encode([text])[0]]
        if len(tokens) > room:
            raise DataError(
                f"{where}: {place}: {field}: the prompt is {len(tokens)} tokens; expected at most {room} (the sequence "
                "length less max_new_tokens), found longer: shorten it or raise the sequence length"
            )
        prompts.append(Prompt(tokens, text, record, place))
    if not prompts:
        raise DataError(f"{where}: holds no records")
    return PromptDataset(prompts, split)


def document_prompts(
    documents: str,
    labels: str,
    where: str,
    split: str,
    tokenizer: TextTokenizer,
    *,
    room: int,
    limit: int | None = None,
) -> PromptDataset:
    """The prompts of pre-tokenised `documents` and their `labels` documents (module docstring), each within `room`
    tokens; a DataError names the file and the document."""
    texts, marks = IndexedDataset(documents), IndexedDataset(labels)
    if len(texts) != len(marks):
        raise DataError(
            f"{where}: {labels} holds {len(marks):,} label documents; expected one for each of the {len(texts):,} "
            f"documents of {documents}"
        )
    prompts = []
    for index in range(len(texts) if limit is None else min(limit, len(texts))):
        tokens, label = texts[index].tolist(), marks[index].tolist()
        place = f"{documents} document {index}"
        first = next((position for position, value in enumerate(label) if value != IGNORE_INDEX), None)
        if len(label) != len(tokens) or not first:
            found = "no prompt before them" if first == 0 else "none" if first is None else f"{len(label)} labels"
            expected = f"a prompt, then labelled answer tokens ({len(tokens)} labels)"
            raise DataError(f"{where}: {place}: expected {expected}, found {found}")
        answer = [t for t, mark in zip(tokens, label, strict=True) if mark != IGNORE_INDEX and t != tokenizer.eod_id]
        prompt = tokens[:first]
        if len(prompt) > room:
            raise DataError(
                f"{where}: {place}: the prompt is {len(prompt)} tokens; expected at most {room} (the sequence length "
                "less max_new_tokens), found longer"
            )
        prompts.append(Prompt(prompt, tokenizer.decode(prompt), {"answer": tokenizer.decode(answer)}, place))
    if not prompts:
        raise DataError(f"{where}: {documents} holds no documents")
    return PromptDataset(prompts, split)


def _prompt_of(record: Any, place: str, where: str, field: str) -> str | list[dict[str, Any]]:
    if not isinstance(record, dict):
        raise DataError(f"{where}: {place}: expected a JSON object, found {type(record).__name__}")
    if field not in record:
        raise DataError(
            f"{where}: {place}: expected a {field} field (the prompt), found none (keys: "
            f"{', '.join(sorted(record)) or 'none'})"
        )
    value = record[field]
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{where}: {place}: {field}: expected a prompt, found an empty string")
        return value
    if isinstance(value, list):
        if problem := message_problem(value, needs_assistant=False):
            raise DataError(f"{where}: {place}: {field}: {problem}")
        return value
    raise DataError(f"{where}: {place}: {field}: expected a string or a list of messages, found {type(value).__name__}")


def collate_prompts(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([sample[key] for sample in samples]) for key in (PROMPT_INDEX, PROMPT_SPLIT)}
