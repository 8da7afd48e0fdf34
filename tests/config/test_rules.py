"""Every cross-field rule: one test each, asserting the exact message."""

import warnings

import pytest
from nxd_config import ConfigError, ConfigNotice, load_config

from .conftest import messages


def errors(config) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(config)
    return messages(info.value)


def test_minimal_is_valid(minimal) -> None:
    load_config(minimal)


def test_parallel_sizes_must_divide_world(minimal) -> None:
    minimal["distributed_strategy"]["tensor_model_parallel_size"] = 3
    minimal["model"].update(num_attention_heads=6, hidden_size=96, num_kv_heads=3)
    assert errors(minimal) == [
        "distributed_strategy: expected tensor * pipeline * context parallel sizes (3 * 1 * 1 = 3) to "
        "divide trainer.devices * trainer.num_nodes (4 * 1 = 4), found a remainder of 1"
    ]


def test_global_batch_must_be_multiple_of_micro_batch_times_dp(minimal) -> None:
    minimal["data"].update(micro_batch_size=2, global_batch_size=6)
    assert errors(minimal) == [
        "data.global_batch_size: expected a multiple of data.micro_batch_size * data-parallel size (2 * 2 = 4), found 6"
    ]


def test_zero3_needs_zero1(minimal) -> None:
    minimal["distributed_strategy"].update(zero1=False, zero3=True)
    assert errors(minimal) == [
        "distributed_strategy.zero3: expected distributed_strategy.zero1 True with it (ZeRO-3 shards what ZeRO-1 "
        "shards, and the parameters between uses), found zero1 False"
    ]


def test_pipeline_stages_need_enough_micro_batches(minimal) -> None:
    minimal["distributed_strategy"].update(pipeline_model_parallel_size=2, tensor_model_parallel_size=1)
    minimal["data"].update(micro_batch_size=1, global_batch_size=2)  # 4 devices, pp 2: dp 2, one micro-batch
    assert errors(minimal) == [
        "data.global_batch_size: expected at least 2 micro-batches per step with 2 pipeline stages (1F1B), found "
        "global_batch_size / (micro_batch_size * data-parallel size) = 2 / (1 * 2) = 1"
    ]
    minimal["distributed_strategy"]["virtual_pipeline_model_parallel_size"] = 2
    minimal["data"]["global_batch_size"] = 10  # 5 micro-batches, rounds of 2 stages: 2 rounds
    assert errors(minimal) == [
        "data.global_batch_size: expected a multiple of 2 micro-batches per step (interleaved 1F1B runs them in "
        "rounds of the pipeline size 2), found global_batch_size / (micro_batch_size * data-parallel size) = "
        "10 / (1 * 2) = 5"
    ]


def test_attention_heads_divisible_by_tp(minimal) -> None:
    minimal["distributed_strategy"]["tensor_model_parallel_size"] = 4
    minimal["model"].update(
        num_attention_heads=6,
        hidden_size=96,
        num_kv_heads=2,
    )
    minimal["distributed_strategy"]["kv_replicator"] = 2
    minimal["data"]["global_batch_size"] = 1
    assert errors(minimal) == [
        "model.num_attention_heads: expected a multiple of tensor_model_parallel_size (4), found 6"
    ]


def test_kv_heads_times_replicator_divisible_by_tp(minimal) -> None:
    minimal["distributed_strategy"]["tensor_model_parallel_size"] = 4
    minimal["data"]["global_batch_size"] = 1
    minimal["model"].update(num_attention_heads=8, num_kv_heads=2)
    assert errors(minimal) == [
        "distributed_strategy.kv_replicator: expected num_kv_heads * kv_replicator (2 * 1 = 2) to be a "
        "multiple of tensor_model_parallel_size (4), found it is not (try kv_replicator: 2)"
    ]
    minimal["distributed_strategy"]["kv_replicator"] = 2
    load_config(minimal)


def test_kv_heads_divide_attention_heads(minimal) -> None:
    minimal["model"].update(num_attention_heads=4, num_kv_heads=3)
    minimal["distributed_strategy"]["kv_replicator"] = 2
    assert errors(minimal) == ["model.num_kv_heads: expected a divisor of model.num_attention_heads (4), found 3"]


def test_sequence_parallel_needs_length_divisible_by_tp(minimal) -> None:
    minimal["distributed_strategy"]["sequence_parallel"] = True
    minimal["model"]["encoder_seq_length"] = 127
    assert errors(minimal) == [
        "model.encoder_seq_length: expected a multiple of tensor_model_parallel_size (2) because "
        "sequence_parallel is on, found 127"
    ]


def test_context_parallel_needs_length_divisible_by_2cp(minimal) -> None:
    minimal["distributed_strategy"].update(tensor_model_parallel_size=1, context_parallel_size=2)
    minimal["model"]["fusions"] = {"ring_attention": True}
    minimal["data"].update(seq_length=130, global_batch_size=2)
    assert errors(minimal) == [
        "data.seq_length: expected a multiple of 2 * context_parallel_size (4) for the load-balanced "
        "context split, found 130"
    ]


def test_context_parallel_requires_ring_attention(minimal) -> None:
    minimal["distributed_strategy"].update(tensor_model_parallel_size=1, context_parallel_size=2)
    minimal["data"]["global_batch_size"] = 2
    assert errors(minimal) == [
        "model.fusions.ring_attention: expected True because context_parallel_size is 2, found False"
    ]


def test_score_biases_refuse_context_parallelism(minimal) -> None:
    minimal["distributed_strategy"].update(tensor_model_parallel_size=1, context_parallel_size=2)
    minimal["model"].update(fusions={"ring_attention": True}, position_embedding_type="rpe")
    minimal["data"]["global_batch_size"] = 2
    assert errors(minimal) == [
        "model.position_embedding_type: rpe is not available with context parallelism (ring attention sees no whole "
        "score matrix to bias); expected distributed_strategy.context_parallel_size 1, found 2"
    ]


def test_pipeline_cuts_count_is_pp_minus_one(minimal) -> None:
    minimal["distributed_strategy"].update(tensor_model_parallel_size=1, pipeline_model_parallel_size=2)
    minimal["model"]["pipeline_cuts"] = ["model.layers.1", "model.layers.2"]
    assert errors(minimal) == ["model.pipeline_cuts: expected pipeline_model_parallel_size - 1 = 1 cut(s), found 2"]


def test_virtual_pipeline_needs_pipeline(minimal) -> None:
    minimal["distributed_strategy"]["virtual_pipeline_model_parallel_size"] = 2
    assert errors(minimal) == [
        "distributed_strategy.virtual_pipeline_model_parallel_size: expected 1 unless "
        "pipeline_model_parallel_size > 1, found 2 with pp = 1"
    ]


def test_virtual_pipeline_needs_layers_divisible_by_pp_times_vpp(minimal) -> None:
    minimal["distributed_strategy"].update(
        tensor_model_parallel_size=1, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2
    )
    minimal["model"]["num_layers"] = 6
    assert errors(minimal) == [
        "model.num_layers: expected a multiple of pipeline * virtual pipeline sizes (2 * 2 = 4), found 6"
    ]


def test_manual_precision_knobs_warn_without_manual(minimal) -> None:
    minimal["precision"] = {"type": "mixed_precision", "master_weights": True}
    with pytest.warns(ConfigNotice) as record:
        load_config(minimal)
    assert [str(w.message) for w in record] == [
        "precision.master_weights: ignored: only read when precision.type is 'manual', found type "
        "'mixed_precision' (which sets this itself)"
    ]


def test_manual_precision_knobs_at_defaults_or_with_manual_are_quiet(minimal) -> None:
    minimal["precision"] = {"type": "mixed_precision", "master_weights": False, "xla_use_bf16": "0"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(minimal)
        minimal["precision"] = {"type": "manual", "master_weights": True, "fp32_grad_acc": True}
        load_config(minimal)


def test_recompute_list_only_with_selective(minimal) -> None:
    minimal["model"].update(
        activations_checkpoint_granularity="full", activations_checkpoint_recompute=["CoreAttention"]
    )
    assert errors(minimal) == [
        "model.activations_checkpoint_recompute: expected null unless activations_checkpoint_granularity "
        "is 'selective', found ['CoreAttention'] with granularity 'full'"
    ]


def test_recompute_mlp_needs_some_recomputation(minimal) -> None:
    minimal["model"]["activations_checkpoint_recompute_mlp"] = True
    assert errors(minimal) == [
        "model.activations_checkpoint_recompute_mlp: expected False when activations_checkpoint_granularity "
        "is null (no recomputation), found True"
    ]


def test_at_most_one_alignment_method(minimal) -> None:
    minimal["data"]["train_dir"] = "/data/x.jsonl"
    minimal["model_alignment_strategy"] = {"sft": {}, "orpo": {"max_prompt_length": 64}, "peft": {}}
    assert errors(minimal) == [
        "model_alignment_strategy: expected at most one of sft, dpo, orpo, kto, reward_model, grpo (peft combines with any), "
        "found sft, orpo"
    ]


def test_kto_needs_a_prompt_length_and_dpo_label_smoothing_fits_its_loss(minimal) -> None:
    minimal["data"]["train_dir"] = "/data/x.jsonl"
    minimal["model_alignment_strategy"] = {"kto": {}}
    assert errors(minimal) == [
        "model_alignment_strategy.kto.max_prompt_length: expected the longest prompt length in tokens, found nothing"
    ]
    minimal["model_alignment_strategy"] = {
        "dpo": {"max_prompt_length": 8, "loss_type": "hinge", "label_smoothing": 0.1}
    }
    assert errors(minimal) == [
        "model_alignment_strategy.dpo.label_smoothing: expected 0 with loss_type hinge (label smoothing applies to "
        "sigmoid and robust), found 0.1"
    ]


def test_peft_combines_with_a_method(minimal) -> None:
    minimal["data"]["train_dir"] = "/data/x.jsonl"
    minimal["model_alignment_strategy"] = {"dpo": {"max_prompt_length": 64}, "peft": {"lora_rank": 8}}
    config = load_config(minimal)
    assert config.model_alignment_strategy.method == "dpo"
    assert config.model_alignment_strategy.peft.lora_rank == 8


def test_dpo_with_a_live_reference_is_accepted(minimal) -> None:
    minimal["data"]["train_dir"] = "/data/x.jsonl"
    minimal["model_alignment_strategy"] = {"dpo": {"max_prompt_length": 64, "precompute_ref_log_probs": False}}
    assert not load_config(minimal).model_alignment_strategy.dpo.precompute_ref_log_probs


def test_preference_prompt_length_required_and_shorter_than_sequence(minimal) -> None:
    minimal["data"]["train_dir"] = "/data/x.jsonl"
    minimal["model_alignment_strategy"] = {"orpo": {}}
    assert errors(minimal) == [
        "model_alignment_strategy.orpo.max_prompt_length: expected the longest prompt length in tokens, found nothing"
    ]
    minimal["model_alignment_strategy"] = {"dpo": {"max_prompt_length": 128}}
    assert errors(minimal) == [
        "model_alignment_strategy.dpo.max_prompt_length: expected less than the sequence length (128) so "
        "that a response fits, found 128"
    ]


def test_alignment_needs_training_data(minimal) -> None:
    minimal["model_alignment_strategy"] = {"sft": {"packing": True}}
    assert errors(minimal) == [
        "data.train_dir: expected the SFT training data (a jsonl, arrow or parquet file or a saved dataset), found nothing"
    ]


def test_megatron_model_requires_its_architecture(minimal) -> None:
    for key in ("num_layers", "hidden_size", "num_attention_heads", "encoder_seq_length"):
        del minimal["model"][key]
    assert errors(minimal) == [
        "model.num_layers: expected a value (required for model_source: megatron)",
        "model.hidden_size: expected a value (required for model_source: megatron)",
        "model.num_attention_heads: expected a value (required for model_source: megatron)",
        "model.encoder_seq_length: expected the training sequence length, found nothing",
    ]


def test_hidden_size_divisible_by_heads_without_kv_channels(minimal) -> None:
    minimal["model"]["hidden_size"] = 66
    assert errors(minimal) == [
        "model.hidden_size: expected a multiple of num_attention_heads (4) when kv_channels is null, found 66"
    ]
    minimal["model"]["kv_channels"] = 16
    load_config(minimal)


def test_hf_model_needs_config_json_and_rejects_megatron_architecture_keys(minimal) -> None:
    minimal["model_source"] = "hf"
    del minimal["model"]["num_attention_heads"]
    minimal["model"]["activation"] = "gelu"
    assert errors(minimal) == [
        "model.model_config: expected the path of a Hugging Face config.json (model_source is hf), found nothing",
        "model.activation: expected no value: this key describes a Megatron-style architecture and "
        "model_source is hf, whose architecture comes from model.model_config",
    ]


def test_a_loss_chunk_is_a_count_of_tokens_for_either_family(minimal) -> None:
    minimal["model_source"] = "hf"
    del minimal["model"]["num_attention_heads"]
    minimal["model"]["model_config"] = "/x/config.json"
    minimal["model"]["fusions"] = {"loss_chunk_tokens": 1024}
    assert load_config(minimal).model.fusions.loss_chunk_tokens == 1024
    minimal["model"]["fusions"] = {"loss_chunk_tokens": -1}
    minimal["model_source"] = "megatron"
    del minimal["model"]["model_config"]
    minimal["model"]["num_attention_heads"] = 4
    assert "model.fusions.loss_chunk_tokens" in " ".join(errors(minimal))


def test_megatron_model_rejects_hf_config(minimal) -> None:
    minimal["model"]["model_config"] = "/x/config.json"
    assert errors(minimal) == [
        "model.model_config: expected no value with model_source: megatron (set model_source: hf to build "
        "a Hugging Face architecture)"
    ]


def test_learned_positions_must_cover_the_sequence(minimal) -> None:
    minimal["model"].update(position_embedding_type="learned_absolute", max_position_embeddings=64)
    assert errors(minimal) == [
        "model.max_position_embeddings: expected at least the sequence length (128) with learned_absolute "
        "positions, found 64"
    ]


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        (
            "model",
            "transformer_block_type",
            "post_ln",
            "expected one of pre_ln, gpt_j, gpt_neox (the block types nxd builds), found 'post_ln'",
        ),
        (
            "distributed_strategy",
            "expert_model_parallel_size",
            2,
            "expected 1 without a model.moe block (a dense model has no experts), found 2",
        ),
        (
            "distributed_strategy",
            "token_shuffle_group_size",
            4,
            "expected 1: nxd routes tokens in their own order, found 4",
        ),
    ],
)
def test_unsupported_features_are_rejected_by_name(minimal, section, key, value, message) -> None:
    minimal[section][key] = value
    assert errors(minimal) == [f"{section}.{key}: {message}"]


def test_a_sliding_window_longer_than_the_sequence_is_a_notice(minimal) -> None:
    """NxDT's Mistral example keeps its 4096 window when its sequence is shortened; transformers accepts it."""
    seq = load_config(minimal).seq_length
    minimal["model"]["sliding_window_size"] = seq
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigNotice)
        assert load_config(minimal).model.sliding_window_size == seq  # as long as the sequence: full causal
    minimal["model"]["sliding_window_size"] = seq + 1
    with pytest.warns(ConfigNotice) as record:
        assert load_config(minimal).model.sliding_window_size == seq + 1
    assert [str(w.message) for w in record] == [
        f"model.sliding_window_size: {seq + 1} is wider than the sequence "
        f"({seq} tokens), so attention is full causal attention, as in "
        "transformers"
    ]


def test_training_must_end(minimal) -> None:
    minimal["trainer"]["max_steps"] = -1
    assert errors(minimal) == [
        "trainer.max_steps: expected trainer.max_steps or trainer.max_epochs to be positive, found -1 and -1 "
        "(training would never end)"
    ]
    minimal["trainer"]["max_epochs"] = 2
    load_config(minimal)


def test_optimizer_required(minimal) -> None:
    del minimal["model"]["optim"]
    assert errors(minimal) == ["model.optim: expected an optimizer such as {name: adamw, lr: 3.0e-4}, found nothing"]


def test_tabular_tokenizer_delimiter_rejected(minimal) -> None:
    minimal["data"]["tokenizer"] = {"type": "/tok", "delimiter": ","}
    assert errors(minimal) == [
        "data.tokenizer.delimiter: expected null: the delimiter belongs to NeMo's tabular tokenizer, which "
        "nxd does not support, found ','"
    ]


def test_checkpoint_model_parallel_size_must_match_layout(minimal) -> None:
    minimal["exp_manager"] = {"checkpoint_callback_params": {"model_parallel_size": 8}}
    assert errors(minimal) == [
        "exp_manager.checkpoint_callback_params.model_parallel_size: expected tensor * pipeline parallel sizes (2), found 8"
    ]


MOE = {
    "num_experts": 8,
    "top_k": 2,
    "capacity_factor": 2.0,
    "output_router_logits": True,
    "router_aux_loss_coef": 0.02,
    "sinkhorn_tol": "None",
}
"""The moe block of NxDT's megatron_mixtral_8x7b_config.yaml."""


def test_nxdt_mixtral_moe_blocks_are_accepted(minimal) -> None:
    minimal["model"]["moe"] = dict(MOE)
    minimal["distributed_strategy"]["expert_model_parallel_size"] = 2
    assert load_config(minimal).model.moe.num_experts == 8
    minimal["model"]["moe"].update(capacity_factor=0.0, dropless=True)  # the dropless recipe writes both
    assert load_config(minimal).model.moe.dropless


@pytest.mark.parametrize(
    ("moe", "strategy", "message"),
    [
        ({"top_k": 9}, {}, "model.moe.top_k: expected at most num_experts (8), found 9"),
        (
            {"num_experts": 1, "top_k": 1},
            {},
            "model.moe.num_experts: expected at least 2 experts (one expert is the dense MLP: remove the moe block), "
            "found 1",
        ),
        (
            {"num_experts": 6},
            {"expert_model_parallel_size": 4, "tensor_model_parallel_size": 1},
            "distributed_strategy.expert_model_parallel_size: expected a divisor of model.moe.num_experts (6), found 4",
        ),
        (
            {"num_experts": 4},
            {"expert_model_parallel_size": 4},
            "distributed_strategy.expert_model_parallel_size: expected a divisor of the data-parallel size (2: "
            "expert-parallel groups are formed from data-parallel ranks), found 4",
        ),
        (
            {"routing_algorithm": "sinkhorn"},
            {},
            "model.moe.routing_algorithm: sinkhorn balances top-1 routing only: expected top_k 1, found 2",
        ),
        (
            {"dropless": True},
            {},
            "model.moe.capacity_factor: expected 0.0 or null with dropless: True (no token is dropped), found 2.0",
        ),
        (
            {"capacity_factor": 0.0},
            {},
            "model.moe.capacity_factor: expected a positive factor, or dropless: True, found 0.0",
        ),
        (
            {"output_router_logits": False},
            {},
            "model.moe.router_aux_loss_coef: the load-balancing loss is computed with output_router_logits: True; "
            "found 0.02 with False",
        ),
        (
            {"routing_algorithm": "deepspeed", "top_k": 3},
            {},
            "model.moe.top_k: DeepSpeed's gate is top-1 or top-2: expected 1 or 2 with routing_algorithm deepspeed, "
            "found 3",
        ),
        (
            {"routing_algorithm": "deepspeed", "normalize_top_k_affinities": True},
            {},
            "model.moe.normalize_top_k_affinities: DeepSpeed's gate weighs by softmax, renormalised for top-2 only: "
            "expected False with routing_algorithm deepspeed, found True",
        ),
    ],
)
def test_moe_mistakes_are_named_before_launch(minimal, moe, strategy, message) -> None:
    minimal["model"]["moe"] = {**MOE, **moe}
    minimal["distributed_strategy"].update(strategy)
    assert errors(minimal) == [message]


def test_deepspeed_moe_settings_outside_their_routing_or_capacity_are_a_notice(minimal) -> None:
    minimal["model"]["moe"] = {**MOE, "capacity_factor": None, "min_capacity": 4, "sample_second_expert": False}
    with pytest.warns(ConfigNotice) as record:
        load_config(minimal)
    assert [str(w.message) for w in record] == [
        "model.moe.sample_second_expert: acted on only by routing_algorithm deepspeed; with top_k it changes nothing",
        "model.moe.min_capacity: acted on only when capacity drops tokens; without a capacity_factor every token is "
        "kept",
    ]


def test_deepspeed_knobs_of_the_other_gate_and_compiled_scans_are_a_notice(minimal) -> None:
    minimal["model"]["moe"] = {
        **MOE,
        "routing_algorithm": "deepspeed",
        "normalize_top_k_affinities": False,
        "random_token_selection": False,
    }
    with pytest.warns(ConfigNotice) as record:
        load_config(minimal)
    assert [str(w.message) for w in record] == [
        "model.moe.random_token_selection: acted on only with top_k 1; with top_k 2 it changes nothing"
    ]
    del minimal["model"]["moe"]
    minimal["model"]["attention_layers"] = ["rwkv"] * minimal["model"]["num_layers"]
    minimal["model"]["fusions"] = {"torch_compile": True}
    with pytest.warns(
        ConfigNotice, match="model.fusions.torch_compile: rwkv layers scan the sequence one step at a time in Python"
    ):
        load_config(minimal)


def test_moe_refuses_context_parallelism(minimal) -> None:
    minimal["model"]["moe"] = dict(MOE)
    minimal["model"]["fusions"] = {"ring_attention": True}
    minimal["distributed_strategy"].update(context_parallel_size=2)
    assert errors(minimal) == [
        "distributed_strategy.context_parallel_size: expected 1 with a model.moe block (the "
        "router's balance is counted over whole sequences), found 2"
    ]


def test_post_training_documents_fit_their_method_and_data(minimal) -> None:
    minimal["data"] |= {
        "micro_batch_size": 1,
        "global_batch_size": 4,
        "example_documents": {
            "train": {"documents": "t", "rewards": "w", "reference": "r"},
            "validation": {"documents": "v", "rewards": "vw"},
        },
        "pack_impl": "packed",
    }
    minimal["model_alignment_strategy"] = {"kto": {"max_prompt_length": 8}}
    assert errors(minimal) == [
        "model_alignment_strategy.kto.max_prompt_length: applies to data.train_dir records, which are cut into prompt "
        "and response; pre-tokenised documents (data.example_documents) are read as written; expected it unset, "
        "found 8",
        "data.pack_impl: expected unpacked with data.example_documents (one document a row, as GPT-NeoX reads "
        "post-training data), found packed",
        "data.example_documents: expected reference log-prob files for every split or for none, found them for 1 of 2",
        "model_alignment_strategy.kto.kl_estimate: expected batch_halves with data.example_documents: the mismatched "
        "estimate pairs each prompt with another record's completion, which pre-tokenised documents do not separate; "
        "found mismatched",
    ]
    minimal["data"] |= {"pack_impl": "unpacked", "example_documents": {"train": {"documents": "t", "rewards": "w"}}}
    minimal["model_alignment_strategy"] = {"kto": {"kl_estimate": "batch_halves"}}
    assert errors(minimal) == [
        "data.micro_batch_size: expected an even micro-batch size with kl_estimate batch_halves (each half's KL is "
        "measured on the other half), found 1"
    ]
    minimal["data"] |= {
        "pair_documents": {
            "train": {"chosen": "c", "rejected": "r", "chosen_reference": "cr", "rejected_reference": "rr"}
        },
        "example_documents": None,
        "micro_batch_size": 2,
        "global_batch_size": 4,
    }
    minimal["model_alignment_strategy"] = {"orpo": {}}
    assert errors(minimal) == [
        "data.pair_documents: reference log-prob files are read by DPO and KTO against a reference model; ORPO has "
        "none: expected no reference files"
    ]


def test_attention_layers_give_one_kind_per_layer_and_sparse_ones_refuse_context_parallelism(minimal) -> None:
    layers = minimal["model"]["num_layers"]
    minimal["model"]["attention_layers"] = ["local"] * (layers + 1)
    assert errors(minimal) == [
        f"model.attention_layers: expected one kind per layer (num_layers: {layers}), found {layers + 1}"
    ]
    minimal["model"]["attention_layers"] = ["bigbird"] + ["dense"] * (layers - 1)
    minimal["model"]["fusions"] = {"ring_attention": True}
    minimal["distributed_strategy"].update(context_parallel_size=2)
    assert errors(minimal) == [
        "model.attention_layers: bigbird layers attend by a block layout, which ring attention "
        "does not take; expected distributed_strategy.context_parallel_size 1, found 2"
    ]


def test_gmlp_layers_refuse_split_sequences_gated_activations_and_experts(minimal) -> None:
    layers = minimal["model"]["num_layers"]
    minimal["model"]["attention_layers"] = ["gmlp"] + ["amlp"] * (layers - 1)
    minimal["model"]["activation"] = "geglu"
    minimal["distributed_strategy"].update(tensor_model_parallel_size=2, sequence_parallel=True)
    mixing = "model.attention_layers: amlp, gmlp layers mix every position of the sequence through one weight matrix"
    assert errors(minimal) == [
        f"{mixing}, which sequence parallelism splits over ranks; expected distributed_strategy.sequence_parallel "
        "false, found true",
        "model.activation: amlp, gmlp layers split their inner activations into a value and a gate themselves; "
        "expected an ungated activation, found geglu",
    ]
    minimal["model"]["activation"] = "gelu"
    minimal["model"]["fusions"] = {"ring_attention": True}
    minimal["distributed_strategy"].update(
        tensor_model_parallel_size=1, sequence_parallel=False, context_parallel_size=2
    )
    assert errors(minimal) == [
        f"{mixing}, which context parallelism splits over ranks; expected "
        "distributed_strategy.context_parallel_size 1, found 2"
    ]


def test_mamba_layers_refuse_experts_a_soft_prompt_and_a_split_sequence(minimal) -> None:
    minimal["model"]["attention_layers"] = ["mamba"] * minimal["model"]["num_layers"]
    minimal["model"]["moe"] = dict(MOE)
    minimal["model"]["fusions"] = {"ring_attention": True}
    minimal["distributed_strategy"].update(context_parallel_size=2)
    found = errors(minimal)
    assert (
        "model.attention_layers: mamba layers scan the whole sequence from its start, which context parallelism "
        "splits over ranks; expected distributed_strategy.context_parallel_size 1, found 2" in found
    )
    assert (
        "model.moe: mamba layers have no MLP to replace with experts; expected one of model.moe and those "
        "layers" in found
    )
    del minimal["model"]["attention_layers"]
    minimal["model"]["mamba_inner_size"] = 96
    with pytest.warns(ConfigNotice, match="model.mamba_inner_size: acted on only by mamba layers"):
        load_config(
            {
                **minimal,
                "model": {k: v for k, v in minimal["model"].items() if k not in ("moe", "fusions")},
                "distributed_strategy": {**minimal["distributed_strategy"], "context_parallel_size": 1},
            }
        )


def test_gmlp_attention_dim_without_amlp_layers_is_a_notice(minimal) -> None:
    minimal["model"]["gmlp_attention_dim"] = 32
    minimal["model"]["attention_layers"] = ["gmlp"] * minimal["model"]["num_layers"]
    with pytest.warns(ConfigNotice) as record:
        load_config(minimal)
    assert [str(w.message) for w in record] == [
        "model.gmlp_attention_dim: acted on only by amlp layers (model.attention_layers); with none it changes nothing"
    ]


def test_sparse_attention_settings_without_sparse_layers_are_a_notice(minimal) -> None:
    minimal["model"]["sparse_attention"] = {"block": 32}
    with pytest.warns(ConfigNotice) as record:
        load_config(minimal)
    assert [str(w.message) for w in record] == [
        "model.sparse_attention: acted on only by sparse layers (model.attention_layers); with none it changes nothing"
    ]


def test_shared_layers_divide_the_stack_and_stay_on_one_stage_without_sequence_parallelism(minimal) -> None:
    layers = minimal["model"]["num_layers"]
    minimal["model"]["num_unique_layers"] = layers + 1
    assert errors(minimal) == [
        f"model.num_unique_layers: expected a divisor of num_layers ({layers}), found {layers + 1}"
    ]
    minimal["model"]["num_unique_layers"] = 1
    minimal["distributed_strategy"].update(sequence_parallel=True, tensor_model_parallel_size=2)
    minimal["model"]["attention_layers"] = ["local"] * layers
    assert errors(minimal) == [
        "model.num_unique_layers: sequence parallelism splits the sequence as the first layer begins, and a shared "
        "first layer begins at several positions; expected distributed_strategy.sequence_parallel false with it, "
        "found true",
        "model.attention_layers: a kind per layer, and model.num_unique_layers shares layers; expected one of them "
        "unset",
    ]


def test_shared_layers_refuse_moe_counted_over_positions(minimal) -> None:
    minimal["model"] |= {"num_unique_layers": 1, "moe": dict(MOE)}
    assert (
        "model.moe: MoE layers are counted over the stack's positions, and model.num_unique_layers shares layers "
        "between positions; expected one of them unset"
    ) in errors(minimal)


def test_a_sharing_style_without_shared_layers_is_a_notice(minimal) -> None:
    minimal["model"]["param_sharing_style"] = "spaced"
    with pytest.warns(ConfigNotice) as record:
        load_config(minimal)
    assert [str(w.message) for w in record] == [
        "model.param_sharing_style: acted on only with model.num_unique_layers; "
        "without it every layer has its own weights"
    ]


def test_router_jitter_is_the_top_k_routers(minimal) -> None:
    minimal["model"]["moe"] = dict(MOE, routing_algorithm="sinkhorn", top_k=1, jitter_eps=0.01)
    assert errors(minimal) == [
        "model.moe.jitter_eps: the top-k router jitters its input (GPT-NeoX's Sinkhorn router "
        "does not); expected routing_algorithm top_k with it, found sinkhorn"
    ]


def test_a_soft_prompt_trains_alone_on_one_stage_and_splits_evenly(minimal) -> None:
    seq = load_config(minimal).seq_length
    minimal["model"]["soft_prompt"] = {"n_tokens": 3}
    minimal["distributed_strategy"].update(
        pipeline_model_parallel_size=2, tensor_model_parallel_size=2, sequence_parallel=True
    )
    minimal["model_alignment_strategy"] = {"dpo": {}, "peft": {"lora_rank": 4}}
    found = errors(minimal)
    assert (
        "model.soft_prompt: the prompt enters before the first stage's layers and the last drops its positions; "
        "expected distributed_strategy.pipeline_model_parallel_size 1 with a soft prompt, found 2" in found
    )
    assert (
        "model.soft_prompt: a soft prompt trains alone (every other weight frozen); expected no "
        "model_alignment_strategy.peft with it" in found
    )
    assert (
        "model.soft_prompt: expected language-model training or sft with a soft prompt (GPT-NeoX's train_impl "
        "normal), found model_alignment_strategy.dpo" in found
    )
    assert (
        "model.soft_prompt.n_tokens: sequence parallelism splits the prompt and the sequence together; expected "
        f"n_tokens + the sequence length ({seq}) to be a multiple of distributed_strategy.tensor_model_parallel_"
        "size (2), found 3"
    ) in found


def test_mup_refuses_what_has_no_base_widths(minimal) -> None:
    minimal["model"]["mup"] = {"init_scale": 2.0}
    minimal["model"]["optim"]["name"] = "lion"
    minimal["model_alignment_strategy"] = {"reward_model": {}, "peft": {"lora_rank": 4}}
    found = errors(minimal)
    assert (
        "model.mup.base_shapes_file: expected the base-shape file to read (or to write, with save_base_shapes), "
        "found none" in found
    )
    assert "model.mup: LoRA's adapters have no base widths; expected no model_alignment_strategy.peft with muP" in found
    assert (
        "model.mup: its score head has no base widths; expected no model_alignment_strategy.reward_model with "
        "muP" in found
    )
    assert (
        "model.mup: muP scales the steps of Adam (MuAdam) and SGD (MuSGD); expected model.optim.name adam, adamw, "
        "adamw_fp32OptState or sgd, found lion" in found
    )


def test_float8_takes_tensor_parallelism_and_gathers_float8_only_under_zero3(minimal) -> None:
    minimal["precision"] = {"type": "mixed_precision", "fp8": {"recipe": "rowwise"}}
    minimal["distributed_strategy"].update(tensor_model_parallel_size=2)
    assert load_config(minimal).precision.fp8.recipe == "rowwise"
    minimal["precision"]["fp8"]["all_gather"] = True
    minimal["distributed_strategy"].update(zero1=False)
    found = errors(minimal)
    assert (
        "precision.fp8.all_gather: weights are gathered only where ZeRO shards them (replicated data parallelism "
        "keeps them whole); expected distributed_strategy.zero1 True with it, found False" in found
    )
    assert (
        "precision.fp8.all_gather: torchao gathers float8 weights for tensorwise scaling only; expected "
        "precision.fp8.recipe tensorwise with it, found rowwise" in found
    )
    assert (
        "precision.fp8.all_gather: with tensor parallelism torchao scales each rank's part of a weight by that "
        "part's own maximum (the gather reduces it over the data-parallel ranks only), so the layers would "
        "compute on other float8 weights than in one process; expected "
        "distributed_strategy.tensor_model_parallel_size 1 with it, found 2" in found
    )
    minimal["distributed_strategy"].update(tensor_model_parallel_size=1)
    minimal["precision"]["fp8"]["recipe"] = "tensorwise"
    minimal["distributed_strategy"].update(zero1=True)
    assert load_config(minimal).precision.fp8.all_gather


def test_mup_switches_and_widths_are_checked(minimal) -> None:
    minimal["model"]["num_attention_heads"] = 4
    minimal["model"]["mup"] = {
        "base_shapes_file": "b.bsh",
        "save_base_shapes": True,
        "coord_check": True,
        "coord_check_widths": [32, 30],
    }
    found = errors(minimal)
    assert (
        "model.mup.coord_check: save_base_shapes writes the base-shape file the coordinate check reads, each "
        "instead of training; expected one of them true per run" in found
    )
    assert "model.mup.coord_check_widths: expected hidden sizes that num_attention_heads (4) divides, found 30" in found
    minimal["model"]["mup"] = {"base_shapes_file": "b.bsh", "width_scale": 4}
    with pytest.warns(ConfigNotice, match="model.mup.width_scale: acted on only with save_base_shapes: true"):
        load_config(minimal)


def test_a_position_multiplier_without_table_positions_is_noticed(minimal) -> None:
    minimal["model"].update(position_embedding_type="rope", position_embedding_multiplier=0.5)
    with pytest.warns(
        ConfigNotice,
        match="model.position_embedding_multiplier: scales learned_absolute or sinusoidal "
        "positions; with rope positions it changes nothing",
    ):
        load_config(minimal)
