"""model_alignment_strategy: one method, its prompts, its loss settings and the data it trains on."""

from __future__ import annotations

import re
from collections.abc import Iterator

from ..schema import NxdConfig
from ..schema.alignment import METHODS, PREFERENCE_METHODS
from .data import documents_of
from .findings import ALIGN, CP, MBS, PP, SEQ, SP, Finding, error, notice


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
    prompt_documents = a is not None and a.grpo is not None and c.data.label_prefixes and c.data.is_set("data_prefix")
    if (
        a is not None
        and a.method is not None
        and c.data.train_dir is None
        and documents_of(c) is None
        and c.data.dataset is None
        and not prompt_documents
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


GRPO = f"{ALIGN}.grpo"
EP = "distributed_strategy.expert_model_parallel_size"


def grpo_rewards(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if a is None or a.grpo is None:
        return
    for index, reward in enumerate(a.grpo.rewards):
        path = f"{GRPO}.rewards[{index}]"
        given = [name for name in ("function", "builtin", "model") if getattr(reward, name) is not None]
        if len(given) != 1:
            yield error(path, f"expected exactly one of function, builtin or model, found {', '.join(given) or 'none'}")
        for name, kinds in (
            ("field", ("exact_match", "numeric")),
            ("pattern", ("regex", "format")),
            ("tolerance", ("numeric",)),
        ):
            if reward.is_set(name) and reward.builtin not in kinds:
                yield error(f"{path}.{name}", f"read by builtin {' and '.join(kinds)} only; expected it unset here")
        if reward.is_set("trust_remote_code") and reward.model is None:
            yield error(f"{path}.trust_remote_code", "read for a reward model only; expected it unset here")
        if reward.function is not None and (reward.function.count(":") != 1 or not all(reward.function.split(":"))):
            yield error(f"{path}.function", f"expected module:function (an import path), found {reward.function!r}")
        if reward.builtin in ("regex", "format") and not reward.pattern:
            yield error(
                f"{path}.pattern", f"expected the regular expression builtin {reward.builtin} matches, found none"
            )
        elif reward.pattern:
            try:
                re.compile(reward.pattern)
            except re.error as problem:
                yield error(
                    f"{path}.pattern",
                    f"expected a regular expression (Python's re), found {reward.pattern!r}: {problem}",
                )


def grpo_groups_and_lengths(c: NxdConfig) -> Iterator[Finding]:
    a = c.model_alignment_strategy
    if a is None or a.grpo is None:
        return
    g = a.grpo
    grouped = g.baseline in ("group_mean", "leave_one_out") or g.scale_rewards == "group"
    if g.num_generations < 2 and grouped:
        yield error(
            f"{GRPO}.num_generations",
            f"expected at least 2 completions a prompt: a group of 1 has no spread for baseline {g.baseline} and "
            f"scale_rewards {g.scale_rewards} to work with (its advantage would always be 0), found 1",
        )
    if c.seq_length is not None and g.max_new_tokens >= c.seq_length:
        yield error(
            f"{GRPO}.max_new_tokens",
            f"expected less than the sequence length ({c.seq_length}) so that prompt and completion fit, found "
            f"{g.max_new_tokens}",
            f"{GRPO}.max_new_tokens",
            *SEQ,
        )


def grpo_layouts(c: NxdConfig) -> Iterator[Finding]:
    """Rollouts run on the policy as it is sharded: tensor and data parallel (ZeRO-1 and -3 included), pipeline
    stages gathered into the whole model on each process; the layouts its cached generation cannot take are
    refused by name."""
    a = c.model_alignment_strategy
    if a is None or a.grpo is None:
        return
    ds = c.distributed_strategy
    if ds.context_parallel_size > 1:
        yield error(
            CP,
            f"expected 1 with {GRPO}: rollouts are sampled with a key/value cache on the policy, which "
            f"context-parallel ranks do not serve; found {ds.context_parallel_size} (tensor, data and pipeline "
            "parallelism do)",
            CP,
            GRPO,
        )
    if ds.expert_model_parallel_size > 1:
        yield error(
            EP,
            f"expected 1 with {GRPO} (rollouts do not route experts across ranks), found "
            f"{ds.expert_model_parallel_size}",
            EP,
            GRPO,
        )
    if ds.sequence_parallel and ds.tensor_model_parallel_size > 1:
        yield error(
            SP,
            f"expected False with {GRPO}: a rollout's one-token steps cannot be split over the tensor-parallel ranks",
            SP,
            GRPO,
        )
