"""A local tokenizer, in each form NxDT configs name it (`data.tokenizer`), as a `tokenizers` tokenizer
with the end-of-document token Megatron appends between documents, the beginning-of-sequence token
fine-tuning records start with, and the chat template of tokenizer_config.json (or
chat_template.jinja) when the directory has one:

- a Hugging Face tokenizer.json file, or a directory holding one (read with `tokenizers`);
- a Hugging Face directory holding only a SentencePiece tokenizer.model (Llama 2), converted by
  transformers (the class tokenizer_config.json names, else LlamaTokenizer);
- a SentencePiece model file of any name (`.model`; GPT-NeoX's SPMTokenizer, NeMo's library sentencepiece), rebuilt
  from its own specification to give sentencepiece's ids (`sentencepiece_model`);
- Megatron's GPT2BPETokenizer from a GPT-2 vocab.json and merges.txt (transformers' GPT2Tokenizer);
- Megatron's CharLevelTokenizer (GPT-NeoX's): a text's UTF-8 bytes are its ids, 512 of them, 0 ends a document;
- Megatron's TiktokenTokenizer: an encoding of OpenAI's tiktoken by name (the `tiktoken` extra), converted
  to a `tokenizers` BPE by transformers' TikTokenConverter.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer

from .errors import DataError
from .files import save_atomically
from .sentencepiece_model import is_sentencepiece_model, read_sentencepiece_model

if TYPE_CHECKING:  # transformers (the `converters` extra) loads only for the forms that need it
    from transformers import PreTrainedTokenizerBase

EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "[SEP]")
"""End-of-document tokens of common tokenizers, tried in order when tokenizer_config.json names none."""
COMPANION_FILES = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
"""Files beside tokenizer.json that complete a Hugging Face tokenizer directory."""
BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "[CLS]")
"""Beginning-of-sequence tokens of common tokenizers, tried when tokenizer_config.json names none; a
tokenizer with none of them (GPT-2's) begins sequences with its end-of-document token, as GPT-2 does."""


MEGATRON_TYPES = ("GPT2BPETokenizer", "CharLevelTokenizer", "TiktokenTokenizer")
"""Megatron tokenizer classes nxd builds (GPT2BPETokenizer from vocab_file and merge_file, TiktokenTokenizer
from the encoding vocab_file names)."""
CHAR_LEVEL_VOCAB = 512
"""The ids GPT-NeoX's CharLevelTokenizer declares (256 bytes used), which its models' embeddings hold."""


@dataclass(frozen=True)
class TokenizerSource:
    """Where a tokenizer comes from, as `data.tokenizer` says it (picklable, for preprocessing workers)."""

    location: str
    """A tokenizer.json file or tokenizer directory, or a SentencePiece model file; for library megatron, the
    tokenizer class name (any other name is read as a Hugging Face tokenizer, as NeMo hands it to AutoTokenizer)."""
    library: str = "huggingface"
    """huggingface, megatron or sentencepiece (location: the model file)."""
    vocab_file: str | None = None
    merge_file: str | None = None
    trust_remote_code: bool = False
    """Let transformers run the Python a tokenizer folder names in its auto_map (model.trust_remote_code)."""


@dataclass(frozen=True)
class TextTokenizer:
    tokenizer: Tokenizer
    eod_id: int
    path: str
    bos_id: int | None = None
    """None: the end-of-document token begins sequences too."""
    chat_template: str | None = None
    """The Jinja chat template of tokenizer_config.json (or chat_template.jinja), when there is one."""
    source_files: tuple[tuple[str, str], ...] | None = ()
    """Files it was built from (name in a tokenizer directory, path here), when not a tokenizer.json; None:
    built from no file (a character-level or tiktoken tokenizer)."""
    declared_size: int | None = None
    """Ids the tokenizer declares beyond those it produces (GPT-NeoX's character-level 512)."""

    @functools.cached_property
    def vocab_size(self) -> int:
        """One more than the largest id (added tokens included; tiktoken encodings leave gaps), or the size the
        tokenizer declares."""
        largest = max(self.tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
        return max(largest + 1, self.declared_size or 0)

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The UTF-8 bytes of the longest vocabulary string: for byte-level, sentencepiece and WordPiece vocabularies
        as many as a token stands for or more, so that n tokens rarely cover more than n x this many bytes of text
        (an unknown token standing for a whole run of text, or a normaliser dropping text, are the exceptions: a
        caller tokenises that much of a long text to decide, never the whole of it)."""
        return max((len(token.encode()) for token in self.tokenizer.get_vocab(with_added_tokens=True)), default=1)

    @property
    def begin_id(self) -> int:
        """The token a fine-tuning record starts with."""
        return self.eod_id if self.bos_id is None else self.bos_id

    @property
    def files(self) -> dict[str, str]:
        """The files that make this tokenizer a Hugging Face tokenizer directory: name there -> path here."""
        if self.source_files is None:
            return {}
        if self.source_files:
            return dict(self.source_files)
        path = Path(self.path)
        file = path / "tokenizer.json" if path.is_dir() else path
        found = {"tokenizer.json": str(file.resolve())}
        found.update(
            {name: str((file.parent / name).resolve()) for name in COMPANION_FILES if (file.parent / name).is_file()}
        )
        return found

    def export_files(self, directory: Path) -> dict[str, str]:
        """`files`; for a tokenizer built from no file (character-level, tiktoken) its tokenizer.json, written
        once under `directory` (by its fingerprint), so that a Hugging Face export carries it too."""
        if self.source_files is not None:
            return self.files
        path = Path(directory) / self.fingerprint / "tokenizer.json"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            save_atomically(path, self.tokenizer.to_str().encode())
        return {"tokenizer.json": str(path.resolve())}

    def token(self, token_id: int) -> str:
        return self.tokenizer.id_to_token(token_id)

    @property
    def fingerprint(self) -> str:
        content = self.tokenizer.to_str() + f"|{self.bos_id}|{self.eod_id}|{self.chat_template}"
        return hashlib.sha256(content.encode()).hexdigest()[:16]

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        """The text of token ids (special tokens left out, as Hugging Face tokenizers decode by default)."""
        return self.tokenizer.decode(ids)


def load_tokenizer(source: str | Path | TokenizerSource, where: str = "data.tokenizer.type") -> TextTokenizer:
    """The tokenizer `source` names (a path means a Hugging Face tokenizer); a DataError naming `where`
    and the file when there is none or it does not parse."""
    if not isinstance(source, TokenizerSource):
        source = TokenizerSource(str(source))
    if source.library == "megatron" and source.location in MEGATRON_TYPES:
        return _megatron_tokenizer(source, where)
    location = source.location
    path = Path(location)
    if source.library == "sentencepiece" or is_sentencepiece_model(path):
        return _sentencepiece_file(path, where)
    if path.is_dir() and not (path / "tokenizer.json").is_file() and (path / "tokenizer.model").is_file():
        return _sentencepiece_directory(path, where, source.trust_remote_code)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        found = "a directory without tokenizer.json" if path.is_dir() else "no such file or directory"
        classes = f"one of {', '.join(MEGATRON_TYPES)} or " if source.library == "megatron" else ""
        raise DataError(
            f"{where}: expected {classes}a tokenizer.json file or a directory holding one (or a "
            f"SentencePiece tokenizer.model), found {found}: {location}"
        )
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as error:  # the Rust library raises its own Exception type
        raise DataError(f"{where}: {file} is not a Hugging Face tokenizer file ({error})") from None
    config = _tokenizer_config(file.parent / "tokenizer_config.json", where)
    eod_id = _first_id(tokenizer, [_content(config.get("eos_token")), *EOD_CANDIDATES])
    if eod_id is None:
        raise DataError(
            f"{where}: {file} has no end-of-document token (expected one of {', '.join(EOD_CANDIDATES)} "
            "or eos_token in tokenizer_config.json)"
        )
    bos_id = _first_id(tokenizer, [_content(config.get("bos_token")), *BOS_CANDIDATES])
    return TextTokenizer(tokenizer, eod_id, str(location), bos_id, _chat_template(config, file.parent))


def _megatron_tokenizer(source: TokenizerSource, where: str) -> TextTokenizer:
    """A Megatron tokenizer class: CharLevelTokenizer, TiktokenTokenizer, or GPT2BPETokenizer (byte-level
    BPE from a GPT-2 vocab.json and merges.txt, documents ended and begun by <|endoftext|>)."""
    prefix = where.rpartition(".")[0] or where
    if source.location == "CharLevelTokenizer":
        return _char_level_tokenizer()
    if source.location == "TiktokenTokenizer":
        return _tiktoken_tokenizer(source.vocab_file, prefix)
    files = {"vocab_file": (source.vocab_file, "vocab.json"), "merge_file": (source.merge_file, "merges.txt")}
    for key, (value, name) in files.items():
        if value is None or not Path(value).is_file():
            found = "none" if value is None else f"no file at {value}"
            raise DataError(f"{prefix}.{key}: expected the GPT-2 {name} of {source.location}, found {found}")
    from transformers import GPT2Tokenizer

    try:
        built = GPT2Tokenizer(vocab=source.vocab_file, merges=source.merge_file)
    except Exception as error:  # json, tokenizers and transformers each raise their own types
        raise DataError(
            f"{prefix}: {source.vocab_file} and {source.merge_file} are not a GPT-2 vocabulary and merges "
            f"({type(error).__name__}: {error})"
        ) from None
    return _from_transformers(
        built, source.vocab_file, where, (("vocab.json", source.vocab_file), ("merges.txt", source.merge_file))
    )


def _char_level_tokenizer() -> TextTokenizer:
    """GPT-NeoX's CharLevelTokenizer: a text's bytes are its ids (as NeoX reads them from the string), 0
    ends a document, 512 ids declared. A byte-level BPE without merges gives exactly the bytes."""
    from tokenizers import decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab, [], fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return TextTokenizer(tokenizer, 0, "CharLevelTokenizer", source_files=None, declared_size=CHAR_LEVEL_VOCAB)


def _tiktoken_tokenizer(name: str | None, prefix: str) -> TextTokenizer:
    """The tiktoken encoding `name` (tiktoken.get_encoding, as Megatron and GPT-NeoX load it: downloaded once,
    then read from tiktoken's cache) as a `tokenizers` BPE with the encoding's ranks, split pattern and
    special tokens at their own ids; documents end with its end-of-text token. Special-token text in a
    document encodes as the special token (GPT-NeoX's tokenize_batch: allowed_special="all")."""
    if not isinstance(name, str) or not name:
        raise DataError(
            f"{prefix}.vocab_file: expected a tiktoken encoding name (such as cl100k_base) for "
            f"TiktokenTokenizer, found {name!r}"
        )
    try:
        import tiktoken
    except ImportError:
        raise DataError(
            f"{prefix}.type: TiktokenTokenizer needs the tiktoken package, which is not installed: "
            "pip install 'nxd-train[tiktoken]'"
        ) from None
    try:
        encoding = tiktoken.get_encoding(name)
    except ValueError as error:  # an unknown name
        raise DataError(f"{prefix}.vocab_file: {error}") from None
    except OSError as error:  # requests' errors are OSErrors: no network and nothing cached
        cache = "TIKTOKEN_CACHE_DIR, else DATA_GYM_CACHE_DIR, else the system temp folder's data-gym-cache"
        raise DataError(
            f"{prefix}.vocab_file: tiktoken could not load encoding {name!r}: it is downloaded once and "
            f"then read offline only from tiktoken's cache ({cache}), and this machine has neither the "
            f"network nor a cached copy ({type(error).__name__})"
        ) from None
    if "<|endoftext|>" not in encoding.special_tokens_set:  # tiktoken's eot_token raises without one
        raise DataError(f"{prefix}.vocab_file: tiktoken encoding {name!r} has no <|endoftext|> token to end documents")
    return TextTokenizer(_converted_encoding(encoding), encoding.eot_token, name, source_files=None)


def _converted_encoding(encoding: Any) -> Tokenizer:
    """A tiktoken Encoding as a `tokenizers` Tokenizer giving the same ids. tiktoken exposes its ranks only
    through encode_single_token and its split pattern only as _pat_str."""
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = {piece: encoding.encode_single_token(piece) for piece in encoding.token_byte_values()}
    specials = {token: encoding.encode_single_token(token) for token in encoding.special_tokens_set}

    class EncodingConverter(TikTokenConverter):
        def extract_vocab_merges_from_model(self, tiktoken_url: str) -> tuple[dict[str, int], list]:
            vocab, merges = super().extract_vocab_merges_from_model(tiktoken_url)
            return {**vocab, **specials}, merges  # special tokens keep their own ids (encodings leave gaps)

        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return ranks

    tokenizer = EncodingConverter(vocab_file=encoding.name, pattern=encoding._pat_str).converted()
    tokenizer.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in specials])
    return tokenizer


def _sentencepiece_file(path: Path, where: str) -> TextTokenizer:
    """A SentencePiece model file, exported to Hugging Face folders as their tokenizer.model."""
    if not path.is_file():
        raise DataError(f"{where}: expected a SentencePiece model file, found no such file: {path}")
    tokenizer, eod_id, bos_id = read_sentencepiece_model(path, where)
    return TextTokenizer(
        tokenizer,
        eod_id,
        str(path),
        None if bos_id == eod_id else bos_id,
        None,
        (("tokenizer.model", str(path.resolve())),),
    )


def _sentencepiece_directory(path: Path, where: str, trust_remote_code: bool) -> TextTokenizer:
    """A directory with a SentencePiece tokenizer.model and no tokenizer.json (Llama 2), converted by
    transformers: the class tokenizer_config.json names, else LlamaTokenizer. A class of the folder's own
    code (auto_map) is refused unless trusted: transformers would otherwise ask on the terminal."""
    from transformers import AutoTokenizer, LlamaTokenizer

    config = _tokenizer_config(path / "tokenizer_config.json", where)
    if (custom := config.get("auto_map")) and not trust_remote_code:
        named = custom.get("AutoTokenizer", custom) if isinstance(custom, dict) else custom
        raise DataError(
            f"{where}: {path / 'tokenizer_config.json'} names the folder's own Python code (auto_map: "
            f"{named}); nxd runs a folder's code only when a run's config trusts it "
            "(model.trust_remote_code: True)"
        )
    try:
        loader = AutoTokenizer if config.get("tokenizer_class") else LlamaTokenizer
        built = loader.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except Exception as error:  # sentencepiece, protobuf and transformers each raise their own types
        raise DataError(
            f"{where}: {path / 'tokenizer.model'} is not a SentencePiece model transformers can load "
            f"({type(error).__name__}: {error})"
        ) from None
    present = [name for name in ("tokenizer.model", *COMPANION_FILES) if (path / name).is_file()]
    files = tuple((name, str((path / name).resolve())) for name in present)
    return _from_transformers(built, str(path), where, files, _chat_template(config, path))


def _from_transformers(
    built: PreTrainedTokenizerBase,
    path: str,
    where: str,
    files: tuple[tuple[str, str], ...],
    chat_template: str | None = None,
) -> TextTokenizer:
    """A transformers tokenizer as a TextTokenizer: its Rust tokenizer and its own special tokens."""
    tokenizer = built.backend_tokenizer
    eod_id = _first_id(tokenizer, [built.eos_token, *EOD_CANDIDATES])
    if eod_id is None:
        raise DataError(f"{where}: {path} has no end-of-document token (expected one of {', '.join(EOD_CANDIDATES)})")
    bos_id = _first_id(tokenizer, [built.bos_token, *BOS_CANDIDATES])
    return TextTokenizer(tokenizer, eod_id, path, None if bos_id == eod_id else bos_id, chat_template, files)


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
