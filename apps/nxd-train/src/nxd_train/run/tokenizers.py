"""The tokenizer of a run's data: the one data.tokenizer names (any form nxd-data reads), or the built-in
corpus's BPE."""

from __future__ import annotations

from pathlib import Path

from nxd_config.schema.data import DataConfig
from nxd_data import DataError, TextTokenizer, TokenizerSource, load_tokenizer

from nxd_train.run.corpus import builtin_tokenizer, names_data, stdlib_corpus


def configured_tokenizer(data: DataConfig, trust_remote_code: bool) -> TextTokenizer:
    """The tokenizer `data.tokenizer` names, in any form nxd-data reads (a folder's own code only when trusted)."""
    t = data.tokenizer
    key = "model" if t is not None and t.library == "sentencepiece" else "type"  # library sentencepiece: its file
    location = None if t is None else getattr(t, key)
    if location is None:
        raise DataError(
            "data.tokenizer.type: expected a tokenizer file or directory (or, with library megatron, "
            "GPT2BPETokenizer, CharLevelTokenizer or TiktokenTokenizer), found none"
        )
    source = TokenizerSource(location, t.library, t.vocab_file, t.merge_file, trust_remote_code=trust_remote_code)
    return load_tokenizer(source, f"data.tokenizer.{key}")


def run_tokenizer(data: DataConfig, cache_dir: Path, trust_remote_code: bool = False) -> TextTokenizer:
    """The tokenizer a run's data is tokenised with: data.tokenizer's, or the built-in corpus's BPE (a run of
    pre-tokenised data names none: DataError)."""
    if data.tokenizer is not None:
        return configured_tokenizer(data, trust_remote_code)
    if names_data(data):
        raise DataError(
            "data.tokenizer: expected the tokenizer of the model's vocabulary (the run's data is "
            "pre-tokenised, so it names none), found none"
        )
    return load_tokenizer(builtin_tokenizer(stdlib_corpus(), cache_dir))
