"""Cross-field rules: what no single key's type can say, one module a concern.

Each rule reads a built `NxdConfig` and yields `Finding`s that name the keys they depend on, so that a finding about
a key the validator had to repair (because its value was invalid) can be dropped. A finding is an error unless it is
a notice. `RULES` runs them in one order, so that a config's problems are always listed alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ..schema import NxdConfig
from .alignment import (
    alignment_needs_train_data,
    dpo_label_smoothing_fits_the_loss,
    grpo_groups_and_lengths,
    grpo_layouts,
    grpo_rewards,
    kto_kl_estimate_fits_the_data,
    one_alignment_method,
    preference_prompt_length,
    reward_packing_under_pipelines,
)
from .data import (
    character_level_perplexity_of_pretraining,
    dataset_records,
    length_groups_need_records,
    post_training_documents,
    sequence_curriculum,
    tabular_tokenizer_unsupported,
    whole_document_samples_need_indexed_data,
)
from .experts import mixture_of_experts
from .findings import Finding
from .logging import (
    checkpoint_model_parallel_size,
    checkpoints_ranked_by_a_loss_keep_the_lowest,
    profiler_memory_dir_needs_memory,
)
from .model import (
    maximal_update,
    model_source_keys,
    positions_cover_sequence,
    sequence_length_required,
    sliding_window_within_the_sequence,
    soft_prompt,
    unsupported_architecture,
)
from .optim import (
    deepspeed_schedule_needs_a_rate,
    float8_all_gather,
    loss_scaling_needs_fp16,
    manual_knobs_need_manual,
    one_cycle_stairs_are_not_read,
    optimizer_required,
    training_has_an_end,
)
from .parallel import (
    context_parallel_needs_ring_attention,
    cpu_offload_needs_sharding,
    global_batch_divisible,
    heads_divisible_by_tp,
    kv_heads_fit_tp,
    parallel_sizes_divide_world,
    pipeline_cuts_match_stages,
    pipeline_has_micro_batches_for_its_stages,
    recompute_needs_selective,
    sequence_splits_evenly,
    virtual_pipeline_fits,
    zero3_needs_zero1,
)

Rule = Callable[[NxdConfig], Iterator[Finding]]
RULES: tuple[Rule, ...] = (
    parallel_sizes_divide_world,
    global_batch_divisible,
    pipeline_has_micro_batches_for_its_stages,
    heads_divisible_by_tp,
    kv_heads_fit_tp,
    sequence_splits_evenly,
    sequence_curriculum,
    character_level_perplexity_of_pretraining,
    profiler_memory_dir_needs_memory,
    context_parallel_needs_ring_attention,
    pipeline_cuts_match_stages,
    virtual_pipeline_fits,
    model_source_keys,
    sequence_length_required,
    positions_cover_sequence,
    unsupported_architecture,
    soft_prompt,
    float8_all_gather,
    maximal_update,
    mixture_of_experts,
    checkpoints_ranked_by_a_loss_keep_the_lowest,
    sliding_window_within_the_sequence,
    recompute_needs_selective,
    optimizer_required,
    deepspeed_schedule_needs_a_rate,
    one_cycle_stairs_are_not_read,
    training_has_an_end,
    tabular_tokenizer_unsupported,
    checkpoint_model_parallel_size,
    manual_knobs_need_manual,
    zero3_needs_zero1,
    cpu_offload_needs_sharding,
    loss_scaling_needs_fp16,
    one_alignment_method,
    preference_prompt_length,
    dpo_label_smoothing_fits_the_loss,
    alignment_needs_train_data,
    length_groups_need_records,
    dataset_records,
    whole_document_samples_need_indexed_data,
    post_training_documents,
    kto_kl_estimate_fits_the_data,
    reward_packing_under_pipelines,
    grpo_rewards,
    grpo_groups_and_lengths,
    grpo_layouts,
)


def check(config: NxdConfig, repaired: list[str]) -> list[Finding]:
    """Run every rule; drop findings that depend on a repaired key."""
    findings = [finding for rule in RULES for finding in rule(config)]
    return [f for f in findings if not any(_overlaps(i, r) for i in f.inputs for r in repaired)]


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".") or a.startswith(b + "[")
