"""A local Hugging Face tokenizer (a tokenizer.json file, or a directory that holds one), through the
`tokenizers` library, with the end-of-document token Megatron appends between documents."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from .errors import DataError

EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "[SEP]")
"""End-of-document tokens of common tokenizers, tried in order when tokenizer_config.json names none."""


@dataclass(frozen=True)
class TextTokenizer:
    tokenizer: Tokenizer
    eod_id: int
    path: str

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can produce (added tokens included)."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest()[:16]

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
    eod = _configured_eos(file.parent / "tokenizer_config.json")
    for candidate in ([eod] if eod else []) + list(EOD_CANDIDATES):
        if (eod_id := tokenizer.token_to_id(candidate)) is not None:
            return TextTokenizer(tokenizer, eod_id, str(location))
    raise DataError(f"{where}: {file} has no end-of-document token (expected one of {', '.join(EOD_CANDIDATES)} "
                    "or eos_token in tokenizer_config.json)")  # fmt: skip


def _configured_eos(config: Path) -> str | None:
    if not config.is_file():
        return None
    eos = json.loads(config.read_text()).get("eos_token")
    return eos.get("content") if isinstance(eos, dict) else eos
