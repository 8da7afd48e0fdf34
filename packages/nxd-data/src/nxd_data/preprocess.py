"""jsonl (plain, .gz or .zst) -> Megatron `.bin/.idx`, one pair per json key, as Megatron-LM's
tools/preprocess_data.py writes them (`{output_prefix}_{key}_document`).

Lines are parsed and tokenised in batches by `workers` processes (one core each: the tokenizer's own
threads are turned off) and written in input order, so the output does not depend on the worker count.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .errors import DataError
from .indexed import IndexedDatasetWriter, data_files, token_dtype
from .jsonl import read_lines
from .tokenizer import TextTokenizer, TokenizerSource, load_tokenizer

BATCH_LINES = 512
BATCH_BYTES = 256 * 1024
"""A batch of lines goes to one worker once it holds this many lines or bytes, whichever comes first."""


@dataclass
class PreprocessSummary:
    documents: int = 0
    tokens: int = 0
    skipped_lines: int = 0
    seconds: float = 0.0
    outputs: list[str] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


_tokenizer: TextTokenizer | None = None


def _start_worker(source: TokenizerSource) -> None:
    global _tokenizer
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one worker process, one core
    _tokenizer = load_tokenizer(source, "--tokenizer")


@contextlib.contextmanager
def _in_this_process(tokenizer: TextTokenizer) -> Iterator[None]:
    """Tokenise here on one core (as one worker process would), leaving the caller's environment as it was."""
    global _tokenizer
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _tokenizer = tokenizer
    try:
        yield
    finally:
        _tokenizer = None
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def _encode(
    job: tuple[str, int, list[str], tuple[str, ...], bool],
) -> tuple[list[list[np.ndarray]], list[tuple[int, str]]]:
    """Token arrays per json key for a batch of lines starting at line `first`, and the bad lines."""
    name, first, lines, keys, append_eod = job
    texts: dict[str, list[str]] = {key: [] for key in keys}
    bad = []
    for number, line in enumerate(lines, start=first):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            values = [record[key] for key in keys]
            if not all(isinstance(value, str) for value in values):
                raise TypeError(f"expected string values for {', '.join(keys)}")
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            problem = f"missing key {error}" if isinstance(error, KeyError) else str(error)
            bad.append(
                (number, f"{name}:{number}: expected a JSON object with string keys {', '.join(keys)}; {problem}")
            )
            continue
        for key, value in zip(keys, values, strict=True):
            texts[key].append(value)
    assert _tokenizer is not None
    encoded = []
    for key in keys:
        documents = _tokenizer.encode(texts[key]) if texts[key] else []
        if append_eod:
            documents = [ids + [_tokenizer.eod_id] for ids in documents if ids]
        encoded.append([np.asarray(ids, dtype=np.int64) for ids in documents if ids])
    return encoded, bad


def _batches(
    inputs: Sequence[Path], keys: tuple[str, ...], append_eod: bool
) -> Iterator[tuple[str, int, list[str], tuple[str, ...], bool]]:
    for path in inputs:
        first, batch, size = 1, [], 0
        for number, line in read_lines(path):
            batch.append(line)
            size += len(line)
            if len(batch) == BATCH_LINES or size >= BATCH_BYTES:
                yield str(path), first, batch, keys, append_eod
                first, batch, size = number + 1, [], 0
        if batch:
            yield str(path), first, batch, keys, append_eod


def preprocess_jsonl(
    inputs: Sequence[str | Path],
    output_prefix: str | Path,
    tokenizer: str | Path | TokenizerSource,
    *,
    json_keys: Sequence[str] = ("text",),
    append_eod: bool = False,
    workers: int = 1,
    skip_bad_lines: bool = False,
    progress: bool = True,
    overwrite: bool = False,
) -> PreprocessSummary:
    """Tokenise every document of `inputs` into `{output_prefix}_{key}_document.bin/.idx`.

    A bad line is a DataError naming file and line (or, with skip_bad_lines, skipped and counted);
    an input that yields no tokens is a DataError and no output is written. Files already under an
    output's names are a DataError unless `overwrite` (they are replaced only when the new ones are whole).
    """
    paths = [Path(path) for path in inputs]
    for path in paths:
        if not path.is_file():
            raise DataError(f"--input: expected a jsonl file (plain, .gz or .zst), found no file at {path}")
    if workers < 1:
        raise DataError(f"--workers: expected at least 1, found {workers}")
    source = tokenizer if isinstance(tokenizer, TokenizerSource) else TokenizerSource(str(tokenizer))
    text_tokenizer = load_tokenizer(source, "--tokenizer")
    keys = tuple(json_keys)
    outputs = [f"{output_prefix}_{key}_document" for key in keys]
    existing = [str(path) for prefix in outputs for path in data_files(prefix) if path.exists()]
    if existing and not overwrite:
        raise DataError(
            f"--output-prefix: {', '.join(existing)} exist already (another data set, or an earlier run "
            "of this one); expected a new prefix, or --overwrite to replace them"
        )
    dtype = token_dtype(text_tokenizer.vocab_size)
    summary = PreprocessSummary(outputs=outputs)
    started = time.perf_counter()
    jobs = _batches(paths, keys, append_eod)
    with contextlib.ExitStack() as stack:  # writers publish their files only if the block succeeds
        bar = stack.enter_context(tqdm(unit=" docs", disable=not progress, desc="preprocess", mininterval=1.0))
        writers = [stack.enter_context(IndexedDatasetWriter(prefix, dtype)) for prefix in outputs]
        if workers == 1:
            stack.enter_context(_in_this_process(text_tokenizer))
            results = map(_encode, jobs)
        else:
            context = multiprocessing.get_context(
                "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            )
            pool = stack.enter_context(context.Pool(workers, initializer=_start_worker, initargs=(source,)))
            results = pool.imap(_encode, jobs, chunksize=1)
        for encoded, bad in results:
            if bad and not skip_bad_lines:
                raise DataError(bad[0][1] + " (pass --skip-bad-lines to skip such lines)")
            summary.skipped_lines += len(bad)
            for writer, documents in zip(writers, encoded, strict=True):
                for ids in documents:
                    writer.add_document(ids)
                    summary.tokens += ids.size
            summary.documents += len(encoded[0])
            bar.update(len(encoded[0]))
        if summary.tokens == 0:
            raise DataError(
                f"--input: {', '.join(map(str, paths))} yielded no tokens for keys {', '.join(keys)}; "
                "nothing was written"
            )
    summary.seconds = time.perf_counter() - started
    return summary
