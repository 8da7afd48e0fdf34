"""nxd_align: objectives (pretraining and SFT token cross-entropy) and LoRA adapters, with DPO and ORPO to come."""

from .lora import LoraConfigError, LoraFamily, LoraSpec, adapters_disabled, base_key, is_adapter_key
from .objectives import IGNORE_INDEX, Objective, TokenObjective, objective_for, token_cross_entropy

__version__ = "0.1.0"

__all__ = [
    "IGNORE_INDEX", "LoraConfigError", "LoraFamily", "LoraSpec", "Objective", "TokenObjective", "adapters_disabled",
    "base_key",
    "is_adapter_key", "objective_for", "token_cross_entropy",
]  # fmt: skip
