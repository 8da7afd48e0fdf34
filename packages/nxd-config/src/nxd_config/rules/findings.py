"""What every rule shares: the keys rules name most, and the `Finding` a rule yields (`error` or `notice`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigIssue

TP = "distributed_strategy.tensor_model_parallel_size"
PP = "distributed_strategy.pipeline_model_parallel_size"
CP = "distributed_strategy.context_parallel_size"
VPP = "distributed_strategy.virtual_pipeline_model_parallel_size"
SP = "distributed_strategy.sequence_parallel"
GATING = ("gmlp", "amlp")
"""model.attention_layers' gMLP kinds: a block in place of attention and MLP, mixing positions by a weight matrix."""
DEVICES, NODES = "trainer.devices", "trainer.num_nodes"
MBS, GBS = "data.micro_batch_size", "data.global_batch_size"
SEQ = ("model.encoder_seq_length", "data.seq_length")
ALIGN = "model_alignment_strategy"
BLOCK_TYPES = ("pre_ln", "gpt_j", "gpt_neox")

MEGATRON_ONLY = (
    "ffn_hidden_size",
    "num_attention_heads",
    "num_kv_heads",
    "kv_channels",
    "init_method_std",
    "use_scaled_init_method",
    "hidden_dropout",
    "attention_dropout",
    "ffn_dropout",
    "apply_query_key_layer_scaling",
    "normalization",
    "layernorm_epsilon",
    "make_vocab_size_divisible_by",
    "persist_layer_norm",
    "share_embeddings_and_output_weights",
    "position_embedding_type",
    "rotary_percentage",
    "activation",
    "transformer_block_type",
    "has_bias",
    "sliding_window_size",
    "attention_bias",
    "mlp_bias",
    "init_method",
    "output_layer_init_method",
    "position_embedding_offset",
    "rpe_num_buckets",
    "rpe_max_distance",
    "qk_layernorm",
    "attention_layers",
    "sparse_attention",
    "num_unique_layers",
    "param_sharing_style",
    "soft_prompt",
    "position_embedding_multiplier",
    "position_embedding_norm",
)
"""Keys that describe a Megatron-style architecture; for hf, config.json describes it."""


@dataclass(frozen=True)
class Finding:
    issue: ConfigIssue
    inputs: tuple[str, ...]
    notice: bool = False


def error(path: str, message: str, *inputs: str) -> Finding:
    return Finding(ConfigIssue(path, message), inputs or (path,))


def notice(path: str, message: str, *inputs: str) -> Finding:
    return Finding(ConfigIssue(path, message), inputs or (path,), notice=True)
