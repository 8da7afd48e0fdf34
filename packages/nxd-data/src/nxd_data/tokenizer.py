"""A local Hugging Face tokenizer (a tokenizer.json file, or a directory that holds one), through the
`tokenizers` library, with the end-of-document token Megatron appends between documents, the
beginning-of-sequence token fine-tuning records start with, and the chat template of
tokenizer_config.json (or chat_template.jinja) when the directory has one."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from .errors import DataError

EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "[SEP]")
"""End-of-document tokens of common tokenizers, tried in order when tokenizer_config.json names none."""
COMPANION_FILES = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
"""Files beside tokenizer.json that complete a Hugging Face tokenizer directory."""
BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "[CLS]")
"""Beginning-of-sequence tokens of common tokenizers, tried when tokenizer_config.json names none; a
tokenizer with none of them (GPT-2's) begins sequences with its end-of-document token, as GPT-2 does."""


@dataclass(frozen=True)
class TextTokenizer:
    tokenizer: Tokenizer
    eod_id: int
    path: str
    bos_id: int | None = None
    """None: the end-of-document token begins sequences too."""
    chat_template: str | None = None
    """The Jinja chat template of tokenizer_config.json (or chat_template.jinja), when there is one."""

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can produce (added tokens included)."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def begin_id(self) -> int:
        """The token a fine-tuning record starts with."""
        return self.eod_id if self.bos_id is None else self.bos_id

    @property
    def files(self) -> dict[str, str]:
        """The files that make this tokenizer a Hugging Face tokenizer directory: name there -> path here."""
        path = Path(self.path)
        file = path / "tokenizer.json" if path.is_dir() else path
        found = {"tokenizer.json": str(file.resolve())}
        found.update({name: str((file.parent / name).resolve()) for name in COMPANION_FILES
                      if (file.parent / name).is_file()})  # fmt: skip
        return found

    def token(self, token_id: int) -> str:
        return self.tokenizer.id_to_token(token_id)

    @property
    def fingerprint(self) -> str:
        content = self.tokenizer.to_str() + f"|{self.bos_id}|{self.eod_id}|{self.chat_template}"
        return hashlib.sha256(content.encode()).hexdigest()[:16]

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self.tokenizer.encode_batch(texts, add_special_tokens=False)]


def load_tokenizer(location: str | Path, where: str = "data.tokenizer.type") -> TextTokenizer:
    """The tokenizer at `location`; a DataError naming `where` and the path when there is none."""
    path = Path(location)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        found = "a directory without tokenizer.json" if path.is_dir() else "no such file or directory"
        raise DataError(
            f"{where}: expected a tokenizer.json file or a directory holding one, found {found}: {location}"
        )
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as error:  # the Rust library raises its own Exception type
        raise DataError(f"{where}: {file} is not a Hugging Face tokenizer file ({error})") from None
    config = _tokenizer_config(file.parent / "tokenizer_config.json", where)
    eod_id = _first_id(tokenizer, [_content(config.get("eos_token")), *EOD_CANDIDATES])
    if eod_id is None:
        raise DataError(f"{where}: {file} has no end-of-document token (expected one of {', '.join(EOD_CANDIDATES)} "
                        "or eos_token in tokenizer_config.json)")  # fmt: skip
    bos_id = _first_id(tokenizer, [_content(config.get("bos_token")), *BOS_CANDIDATES])
    return TextTokenizer(tokenizer, eod_id, str(location), bos_id, _chat_template(config, file.parent))


def _tokenizer_config(config: Path, where: str) -> dict:
    if not config.is_file():
        return {}
    try:
        content = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise DataError(f"{where}: {config}: expected a JSON object, found unreadable content ({error})") from None
    if not isinstance(content, dict):
        raise DataError(f"{where}: {config}: expected a JSON object, found {type(content).__name__}")
    return content


def _content(token: str | dict | None) -> str | None:
    return token.get("content") if isinstance(token, dict) else token


def _first_id(tokenizer: Tokenizer, candidates: list[str | None]) -> int | None:
    for candidate in candidates:
        if candidate and (token_id := tokenizer.token_to_id(candidate)) is not None:
            return token_id
    return None


def _chat_template(config: dict, directory: Path) -> str | None:
    """tokenizer_config.json's chat_template (a string, or named templates: the "default" one), else
    chat_template.jinja beside it (where transformers saves it)."""
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    if template is None and (directory / "chat_template.jinja").is_file():
        template = (directory / "chat_template.jinja").read_text()
    return template if isinstance(template, str) else None
