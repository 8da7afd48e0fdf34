"""nxd-models: the Megatron-style GPT/Llama decoder and Hugging Face causal LMs, with their TP plans."""

from .attention import AttentionKernel, CoreAttention
from .build import build_causal_lm, build_on_meta, causal_lm_logits
from .context_parallel import use_context_parallel
from .errors import ModelConfigError
from .flops import training_flops_per_token
from .gpt import GPT_TP_PLAN, GPTConfig, GPTForCausalLM, gpt_tp_plan
from .hf import SUPPORTED_MODEL_TYPES, HFOverrides, hf_tp_plan, load_hf_config
from .hf_mapping import HFMapping, hf_mapping
from .hf_recompute import recompute_core_attention
from .pipeline import decoder_layers, keep_pipeline_stage, pipeline_stage_problems
from .qkv import QKVLinear

__version__ = "0.1.0"

__all__ = [
    "GPT_TP_PLAN", "SUPPORTED_MODEL_TYPES", "AttentionKernel", "CoreAttention", "GPTConfig", "GPTForCausalLM",
    "HFMapping", "HFOverrides", "ModelConfigError", "QKVLinear", "build_causal_lm", "build_on_meta",
    "causal_lm_logits", "gpt_tp_plan", "hf_mapping", "hf_tp_plan", "load_hf_config", "recompute_core_attention",
    "training_flops_per_token", "use_context_parallel", "decoder_layers", "pipeline_stage_problems",
    "keep_pipeline_stage",
]  # fmt: skip
