"""nxd-models: the Megatron-style GPT/Llama decoder and Hugging Face causal LMs, and the model protocol
(`ModelFamily`) through which the rest of nxd shards, recomputes, stages and exports them."""

from importlib.metadata import version as _distribution_version

from .attention import AttentionKernel
from .build import build_causal_lm, causal_lm_logits, initialise
from .device_peaks import Ceiling, device_ceiling, peak_memory, resident_memory
from .errors import ModelConfigError
from .family import ModelFamily, model_family
from .gpt import GPTConfig, GPTForCausalLM
from .hf import HFOverrides, load_hf_config
from .initialisation import InitModule, Seeder, init_rule, initial_values, seed_or_drawn
from .moe import MoESpec, routing_metrics, set_aux_loss_weights, take_routing_totals
from .sparse_attention import SparsitySpec
from .token_losses import IGNORE_INDEX

__version__ = _distribution_version("nxd-models")  # one source: the pyproject's version

__all__ = [
    "IGNORE_INDEX",
    "AttentionKernel",
    "Ceiling",
    "GPTConfig",
    "GPTForCausalLM",
    "HFOverrides",
    "InitModule",
    "MoESpec",
    "ModelConfigError",
    "ModelFamily",
    "Seeder",
    "SparsitySpec",
    "build_causal_lm",
    "causal_lm_logits",
    "device_ceiling",
    "init_rule",
    "initial_values",
    "initialise",
    "load_hf_config",
    "model_family",
    "peak_memory",
    "resident_memory",
    "routing_metrics",
    "seed_or_drawn",
    "set_aux_loss_weights",
    "take_routing_totals",
]
