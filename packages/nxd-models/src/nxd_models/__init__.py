"""nxd-models: the Megatron-style GPT/Llama decoder and Hugging Face causal LMs, and the model protocol
(`ModelFamily`) through which the rest of nxd shards, recomputes, stages and exports them."""

from importlib.metadata import version as _distribution_version

from .attention import AttentionKernel, CoreAttention
from .build import build_causal_lm, build_on_meta, causal_lm_logits, initialise
from .context_parallel import use_context_parallel
from .device_peaks import PEAKS, Ceiling, datasheet_peak, device_ceiling, measured_peak, peak_memory, resident_memory
from .errors import ModelConfigError
from .family import HuggingFaceFamily, MegatronFamily, ModelFamily, model_family
from .flops import training_flops_per_token
from .gpt import GPT_TP_PLAN, GPTConfig, GPTForCausalLM, gpt_tp_plan
from .hf import SUPPORTED_MODEL_TYPES, HFOverrides, hf_tp_plan, load_hf_config
from .hf_mapping import HFMapping, hf_mapping
from .hf_moe import set_moe
from .hf_qkv import set_qkv_linear
from .hf_recompute import recompute_core_attention
from .initialisation import InitModule, Seeder, init_rule, initial_values, seed_or_drawn
from .moe import (
    MoELayer,
    MoESpec,
    RoutingTotals,
    load_balancing_loss,
    moe_layers,
    routing_metrics,
    set_aux_loss_weights,
    take_routing_totals,
)
from .neox_layout import NeoXLayout, NeoXSource, neox_layout
from .pipeline import decoder_layers, keep_pipeline_stage, pipeline_stage_problems
from .qkv import QKVLinear
from .score_head import HEADS, ScoreHead
from .token_losses import IGNORE_INDEX, chunked_token_cross_entropy, token_cross_entropy

__version__ = _distribution_version("nxd-models")  # one source: the pyproject's version

__all__ = [
    "HEADS",
    "ScoreHead",
    "GPT_TP_PLAN", "IGNORE_INDEX", "PEAKS", "SUPPORTED_MODEL_TYPES", "AttentionKernel", "Ceiling", "CoreAttention",
    "GPTConfig", "GPTForCausalLM", "HFMapping", "HFOverrides", "HuggingFaceFamily", "InitModule", "MegatronFamily",
    "MoELayer", "MoESpec", "ModelConfigError", "ModelFamily", "NeoXLayout", "NeoXSource", "QKVLinear", "RoutingTotals",
    "Seeder", "build_causal_lm", "build_on_meta", "causal_lm_logits", "chunked_token_cross_entropy", "datasheet_peak",
    "decoder_layers", "device_ceiling", "gpt_tp_plan", "hf_mapping", "hf_tp_plan", "init_rule", "initial_values",
    "initialise", "keep_pipeline_stage", "load_balancing_loss", "load_hf_config", "measured_peak", "model_family",
    "moe_layers", "neox_layout", "peak_memory", "pipeline_stage_problems", "recompute_core_attention",
    "resident_memory", "routing_metrics", "seed_or_drawn", "set_aux_loss_weights", "set_moe", "set_qkv_linear",
    "take_routing_totals", "token_cross_entropy", "training_flops_per_token", "use_context_parallel",
]  # fmt: skip
