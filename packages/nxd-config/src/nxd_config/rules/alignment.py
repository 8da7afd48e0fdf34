"""model_alignment_strategy: one method, its prompts, its loss settings and the data it trains on."""

from __future__ import annotations

from collections.abc import Iterator

from ..schema import NxdConfig
from ..schema.alignment import METHODS, PREFERENCE_METHODS
from .data import documents_of
from .findings import ALIGN, CP, MBS, PP, SEQ, Finding, error, notice


def one_alignment_method(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if a is None:
        return
    chosen = [name for name in METHODS if getattr(a, name) is not None]
    if len(chosen) > 1:
        yield error(
            ALIGN, f"expected at most one of {', '.join(METHODS)} (peft combines with any), found {', '.join(chosen)}"
        )


def preference_prompt_length(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if a is None:
        return
    for name in PREFERENCE_METHODS:
        block = getattr(a, name)
        if block is None:
            continue
        path = f"{ALIGN}.{name}.max_prompt_length"
        if documents_of(c) is not None:
            for cut in ("max_prompt_length", "truncation_mode"):
                if block.is_set(cut):
                    yield error(
                        f"{ALIGN}.{name}.{cut}",
                        f"applies to data.train_dir records, which are cut into "
                        f"prompt and response; pre-tokenised documents ({documents_of(c)}) are read as "
                        f"written; expected it unset, found {getattr(block, cut)!r}",
                    )
        elif block.max_prompt_length is None:
            yield error(path, "expected the longest prompt length in tokens, found nothing")
        elif c.seq_length is not None and block.max_prompt_length >= c.seq_length:
            yield error(
                path,
                f"expected less than the sequence length ({c.seq_length}) so that a "
                f"response fits, found {block.max_prompt_length}",
                path,
                *SEQ,
            )


def dpo_label_smoothing_fits_the_loss(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if a is None or a.dpo is None or a.dpo.label_smoothing == 0 or a.dpo.loss_type in ("sigmoid", "robust"):
        return
    path = f"{ALIGN}.dpo.label_smoothing"
    yield error(
        path,
        f"expected 0 with loss_type {a.dpo.loss_type} (label smoothing applies to sigmoid and robust), "
        f"found {a.dpo.label_smoothing}",
        path,
        f"{ALIGN}.dpo.loss_type",
    )


def alignment_needs_train_data(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if (
        a is not None
        and a.method is not None
        and c.data.train_dir is None
        and documents_of(c) is None
        and c.data.dataset is None
    ):
        yield error(
            "data.train_dir",
            f"expected the {a.method.upper()} training data (a jsonl, "
            f"arrow or parquet file or a saved dataset), found nothing",
            "data.train_dir",
            ALIGN,
        )


def kto_kl_estimate_fits_the_data(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if a is None or a.kto is None:
        return
    path = f"{ALIGN}.kto.kl_estimate"
    documents = c.data.example_documents is not None
    if a.kto.kl_estimate == "mismatched" and documents:
        yield error(
            path,
            "expected batch_halves with data.example_documents: the mismatched estimate pairs each "
            "prompt with another record's completion, which pre-tokenised documents do not separate; found "
            "mismatched",
            path,
            "data.example_documents",
        )
    if a.kto.kl_estimate == "batch_halves":
        if not documents:
            yield error(
                path,
                "expected mismatched with data.train_dir records (batch_halves reads "
                "data.example_documents), found batch_halves",
                path,
                "data.train_dir",
            )
        if c.data.micro_batch_size % 2:
            yield error(
                MBS,
                f"expected an even micro-batch size with kl_estimate batch_halves (each half's KL is "
                f"measured on the other half), found {c.data.micro_batch_size}",
                MBS,
                path,
            )


def reward_packing_under_pipelines(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if a is None or a.reward_model is None or not a.reward_model.is_set("packing") or not a.reward_model.packing:
        return
    d = c.distributed_strategy
    if d.pipeline_model_parallel_size > 1 or d.context_parallel_size > 1:
        path, why = f"{ALIGN}.reward_model.packing", []
        if d.pipeline_model_parallel_size > 1:
            why.append("pipeline parallelism (its stages pass one shape)")
        if d.context_parallel_size > 1:
            why.append("context parallelism (its ring attention would compute the whole packed row)")
        yield notice(path, f"rows stay padded under {' and '.join(why)}; the scores are the same", path, PP, CP)
