"""nxd-models: the Megatron-style GPT/Llama decoder and Hugging Face causal LMs, and the model protocol
(`ModelFamily`) through which the rest of nxd shards, recomputes, stages and exports them."""

from importlib.metadata import version as _distribution_version

from .attention import AttentionKernel
from .base_shapes import gpt_base_shapes, widened
from .build import build_causal_lm, causal_lm_logits, initialise
from .coordinate_check import COORD_STEPS, coordinate_sizes, neox_widths
from .device_peaks import Ceiling, device_ceiling, peak_memory, resident_memory
from .errors import ModelConfigError
from .family import ModelFamily, model_family
from .gpt import GPTConfig, GPTForCausalLM
from .hf import HFOverrides, load_hf_config
from .initialisation import InitModule, Seeder, init_rule, initial_values, seed_or_drawn
from .layer_kinds import LayerKind, layer_kinds, register_layer_kind, unregister_layer_kind
from .maximal_update import MupSpec, base_shapes_text, read_base_shapes
from .moe import MoESpec, routing_metrics, set_aux_loss_weights, take_routing_totals
from .rwkv import RWKVSpec
from .selective_state_space import MambaSpec
from .sparse_attention import SparsitySpec
from .spatial_gating import GMLPSpec
from .token_losses import IGNORE_INDEX, set_loss_temperature

__version__ = _distribution_version("nxd-models")  # one source: the pyproject's version

__all__ = [
    "COORD_STEPS",
    "IGNORE_INDEX",
    "AttentionKernel",
    "Ceiling",
    "GMLPSpec",
    "GPTConfig",
    "GPTForCausalLM",
    "HFOverrides",
    "InitModule",
    "LayerKind",
    "MambaSpec",
    "MoESpec",
    "MupSpec",
    "ModelConfigError",
    "ModelFamily",
    "RWKVSpec",
    "Seeder",
    "SparsitySpec",
    "base_shapes_text",
    "build_causal_lm",
    "causal_lm_logits",
    "coordinate_sizes",
    "device_ceiling",
    "gpt_base_shapes",
    "init_rule",
    "initial_values",
    "initialise",
    "layer_kinds",
    "load_hf_config",
    "model_family",
    "neox_widths",
    "peak_memory",
    "read_base_shapes",
    "register_layer_kind",
    "resident_memory",
    "routing_metrics",
    "seed_or_drawn",
    "set_aux_loss_weights",
    "set_loss_temperature",
    "take_routing_totals",
    "unregister_layer_kind",
    "widened",
]
