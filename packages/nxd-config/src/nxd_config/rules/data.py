"""The data: curricula, character-level perplexity, tokenizers, dataset records and documents."""

from __future__ import annotations

import math
from collections.abc import Iterator

from ..schema import NxdConfig
from .findings import ALIGN, CP, PP, SEQ, TP, Finding, error, notice


def sequence_curriculum(c: NxdConfig) -> Iterator[Finding]:
    cur, ds, path = c.data.curriculum, c.distributed_strategy, "data.curriculum"
    if not cur.enabled:
        return
    if ds.pipeline_model_parallel_size > 1:
        yield error(
            path,
            "pipeline stages exchange activations of one fixed shape, and the curriculum changes the "
            f"sequence length; expected pipeline_model_parallel_size 1, found "
            f"{ds.pipeline_model_parallel_size}",
            path,
            PP,
        )
    a = c.model_alignment_strategy
    if a is not None and a.method is not None:
        yield error(
            path,
            f"cuts pretraining samples (as GPT-NeoX cuts them); {a.method}'s records would lose the "
            "tokens they train on; expected data.curriculum.enabled False",
            path,
            ALIGN,
        )
    seq = c.seq_length
    longest = cur.max_length or seq
    if seq is not None and longest is not None and longest > seq:
        yield error(
            f"{path}.max_length",
            f"expected at most the sequence length ({seq}), found {longest}",
            f"{path}.max_length",
            *SEQ,
        )
    if cur.schedule == "fixed_discrete":
        if not cur.lengths or len(cur.max_steps) != len(cur.lengths) - 1:
            yield error(
                f"{path}.max_steps",
                f"expected one fewer max_steps than lengths (the last length stays), "
                f"found {len(cur.max_steps)} for {len(cur.lengths)} lengths",
            )
        elif cur.lengths[0] != cur.min_length:
            yield error(f"{path}.lengths", f"expected min_length ({cur.min_length}) first, found {cur.lengths[0]}")
        elif cur.max_steps and (cur.max_steps[0] < 1 or list(cur.max_steps) != sorted(set(cur.max_steps))):
            yield error(f"{path}.max_steps", f"expected increasing steps from 1, found {list(cur.max_steps)}")
        used = set(cur.lengths)
    else:
        if cur.min_length < cur.length_step:
            yield error(
                f"{path}.min_length",
                f"expected at least length_step ({cur.length_step}): lengths are "
                f"rounded down to its multiples, found {cur.min_length}",
            )
        used = {cur.length_step}
    tp, cp = ds.tensor_model_parallel_size, ds.context_parallel_size
    divisor = math.lcm(tp if ds.sequence_parallel else 1, 2 * cp if cp > 1 else 1)
    uneven = sorted(length for length in used | {longest} if length is not None and length % divisor)
    if divisor > 1 and uneven:
        key = "lengths" if cur.schedule == "fixed_discrete" else "length_step"
        yield error(
            f"{path}.{key}",
            f"every length must split over the ranks that share a sequence (a multiple of "
            f"{divisor}: tensor parallel with sequence_parallel, 2 x context parallel); found "
            f"{', '.join(map(str, uneven))}",
            f"{path}.{key}",
            TP,
            CP,
        )


def character_level_perplexity_of_pretraining(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if c.trainer.char_level_ppl and a is not None and a.method is not None:
        yield error(
            "trainer.char_level_ppl",
            f"counts the characters of pretraining samples, whose every token the "
            f"loss covers (as GPT-NeoX counts them); {a.method} trains on part of its records; expected False",
            "trainer.char_level_ppl",
            ALIGN,
        )


def tabular_tokenizer_unsupported(c: NxdConfig) -> Iterator[Finding]:
    tokenizer = c.data.tokenizer
    if tokenizer is not None and tokenizer.delimiter is not None:
        yield error(
            "data.tokenizer.delimiter",
            f"expected null: the delimiter belongs to NeMo's "
            f"tabular tokenizer, which nxd does not support, found {tokenizer.delimiter!r}",
        )


def length_groups_need_records(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if c.data.group_by_length and (a is None or a.sft is None or documents_of(c) is not None):
        yield error(
            "data.group_by_length",
            "groups fine-tuning records (model_alignment_strategy.sft with "
            "data.train_dir or data.dataset); found none to group",
            "data.group_by_length",
            ALIGN,
        )


def dataset_records(c: NxdConfig) -> Iterator[Finding]:
    d, a = c.data, c.model_alignment_strategy
    if d.dataset is None:
        return
    for other in ("train_dir", "val_dir"):
        if getattr(d, other) is not None:
            yield error(
                f"data.{other}", "expected one data source, found data.dataset as well", f"data.{other}", "data.dataset"
            )
    method = None if a is None else a.method
    wanted = ("dpo", "orpo", "reward_model") if d.dataset.kind == "preference" else ("sft",)
    if method not in wanted:
        yield error(
            "data.dataset.kind",
            f"{d.dataset.kind} records are trained by model_alignment_strategy."
            f"{' / '.join(wanted)}; found {method or 'pretraining'}",
            "data.dataset",
            ALIGN,
        )


def whole_document_samples_need_indexed_data(c: NxdConfig) -> Iterator[Finding]:
    d = c.data
    reads_records = d.train_dir is not None and (d.use_sft_style_data_module or not d.is_set("data_prefix"))
    if d.pack_impl != "packed" and reads_records:
        yield error(
            "data.pack_impl",
            f"expected packed with data.train_dir (its records are packed or padded by "
            f"their own keys); {d.pack_impl} cuts samples from data_prefix's indexed documents, found "
            f"{d.pack_impl}",
            "data.pack_impl",
            "data.train_dir",
        )
    if d.pack_impl == "packed" and not d.allow_chopped and documents_of(c) is None:
        yield notice(
            "data.allow_chopped",
            "acted on only with pack_impl pack_until_overflow or unpacked; packed "
            "samples are cut across documents whatever their length",
            "data.allow_chopped",
        )


def documents_of(c: NxdConfig) -> str | None:
    """The key of the run's pre-tokenised post-training documents, when it names some."""
    return next(
        (f"data.{name}" for name in ("pair_documents", "example_documents") if getattr(c.data, name) is not None), None
    )


def post_training_documents(c: NxdConfig) -> Iterator[Finding]:
    d, a = c.data, c.model_alignment_strategy
    method = None if a is None else a.method
    for name, methods in (("pair_documents", ("dpo", "orpo", "reward_model")), ("example_documents", ("kto",))):
        files = getattr(d, name)
        if files is None:
            continue
        path = f"data.{name}"
        if method not in methods:
            yield error(
                path,
                f"expected model_alignment_strategy.{' / '.join(methods)} to train on these documents, "
                f"found {method or 'pretraining'}",
                path,
                ALIGN,
            )
        if files.train is None:
            yield error(f"{path}.train", "expected the training documents, found none", path)
        for other in ("train_dir", "val_dir", "data_prefix"):
            if getattr(d, other) is not None and (other != "data_prefix" or d.is_set(other)):
                yield error(f"data.{other}", f"expected one data source, found {path} as well", f"data.{other}", path)
        if d.pack_impl != "unpacked" and d.is_set("pack_impl"):
            yield error(
                "data.pack_impl",
                f"expected unpacked with {path} (one document a row, as GPT-NeoX reads "
                f"post-training data), found {d.pack_impl}",
                "data.pack_impl",
                path,
            )
        splits = [split for split in (files.train, files.validation, files.test) if split is not None]
        referenced = [
            split
            for split in splits
            if any(
                getattr(split, key, None) is not None for key in ("chosen_reference", "rejected_reference", "reference")
            )
        ]
        if referenced and len(referenced) != len(splits):
            yield error(
                path,
                "expected reference log-prob files for every split or for none, found them for "
                f"{len(referenced)} of {len(splits)}",
                path,
            )
        if referenced and method is not None and a is not None:
            block = getattr(a, method)
            if method in ("orpo", "reward_model") or getattr(block, "reference_free", False):
                why = "reference_free" if method == "dpo" else method.upper()
                yield error(
                    path,
                    f"reference log-prob files are read by DPO and KTO against a reference model; "
                    f"{why} has none: expected no reference files",
                    path,
                    ALIGN,
                )
            elif block.is_set("precompute_ref_log_probs") and not block.precompute_ref_log_probs:
                yield error(
                    f"{ALIGN}.{method}.precompute_ref_log_probs",
                    "expected true (or unset) with reference "
                    "log-prob files, which are the precomputed reference; found false",
                    path,
                )
