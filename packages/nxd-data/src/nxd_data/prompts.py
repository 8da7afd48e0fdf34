"""Prompt data of online RL (GRPO): records of a prompt and whatever else the rewards read (an answer ...).

Records come from jsonl (plain, .gz, .zst) or Hugging Face data. The prompt field holds a string (tokens: BOS +
its text) or a list of messages, rendered with the tokenizer's chat template and its generation prompt. A sample
is one prompt, by its index: the run samples its completions and reads the record back for the rewards.
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
from .sft import read_records
from .tokenizer import TextTokenizer

PROMPT_INDEX = "prompt_index"
"""A prompt sample's key: its index in the dataset (-1 for the padding that fills a short batch)."""


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    text: str | list[dict[str, Any]]
    """What the rewards see as the prompt: the string, or the messages."""
    record: dict[str, Any]
    place: str
    """Where the record is ("FILE line N"), for messages about it."""


class PromptDataset(Dataset):
    def __init__(self, prompts: list[Prompt]):
        self.prompts = prompts

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {PROMPT_INDEX: torch.tensor(index)}

    def padding(self) -> dict[str, torch.Tensor]:
        """The sample that fills a short batch: no prompt, no completions trained on."""
        return {PROMPT_INDEX: torch.tensor(-1)}

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
    return PromptDataset(prompts)


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
    return {PROMPT_INDEX: torch.stack([sample[PROMPT_INDEX] for sample in samples])}
