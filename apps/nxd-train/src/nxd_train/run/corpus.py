"""The built-in pretraining text: Python's own standard-library sources, present on every machine.

Until a run names its data (`data.data_prefix`, `data.train_dir` ...), nxd pretrains on this corpus,
tokenised by `data.tokenizer` when given, otherwise by a byte-level BPE trained on the corpus on
first use (cached under `cache_dir`, written atomically, so concurrent ranks and interrupted runs
never see half a file).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from nxd_config.schema.data import DataConfig
from nxd_data import save_atomically
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BUILTIN_VOCAB_SIZE = 4096
EOD_TOKEN = "<|endoftext|>"
CORPUS_BYTES = 3_000_000


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nxd"


@dataclass(frozen=True)
class Corpus:
    documents: list[str]

    @functools.cached_property
    def key(self) -> str:
        """A digest of the text, naming the cached tokenizer and token files (computed once)."""
        digest = hashlib.sha256()
        for document in self.documents:
            digest.update(document.encode("utf-8", "replace"))
        return digest.hexdigest()[:16]


def stdlib_corpus(limit_bytes: int = CORPUS_BYTES) -> Corpus:
    """Source files of the running Python's standard library, in a fixed order, up to `limit_bytes`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    documents, total = [], 0
    packages = (d for d in sorted(root.iterdir()) if d.is_dir() and d.name not in ("site-packages", "test"))
    for path in itertools.chain(sorted(root.glob("*.py")), (p for d in packages for p in sorted(d.glob("*.py")))):
        text = path.read_text(encoding="utf-8", errors="replace")
        documents.append(text)
        total += len(text)
        if total >= limit_bytes:
            break
    return Corpus(documents)


def builtin_tokenizer(corpus: Corpus, cache_dir: Path) -> Path:
    """A byte-level BPE with BUILTIN_VOCAB_SIZE entries trained on the corpus: its tokenizer.json (cached)."""
    path = cache_dir / f"stdlib-bpe-{BUILTIN_VOCAB_SIZE}-{corpus.key}.json"
    if not path.exists():
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=BUILTIN_VOCAB_SIZE,
            special_tokens=[EOD_TOKEN],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(corpus.documents, trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_atomically(path, tokenizer.to_str().encode())
    return path


def names_data(data: DataConfig) -> bool:
    """Whether `data` names a pretraining source of its own (else the built-in corpus is read)."""
    return data.is_set("data_prefix") or data.train_dir is not None or data.dataset is not None
