"""nxd_align: objectives (pretraining and SFT token cross-entropy), LoRA adapters, and the DPO and ORPO
losses (their objectives, with reference log-probs, to come)."""

from .lora import LoraConfigError, LoraFamily, LoraSpec, adapters_disabled, base_key, is_adapter_key
from .objectives import IGNORE_INDEX, Objective, TokenObjective, objective_for, token_cross_entropy
from .preference import DPOObjective, ORPOObjective, PreferenceTerms, dpo_loss, orpo_loss, sequence_log_probs

__version__ = "0.1.0"

__all__ = [
    "IGNORE_INDEX", "DPOObjective", "LoraConfigError", "LoraFamily", "LoraSpec", "ORPOObjective", "Objective",
    "PreferenceTerms", "TokenObjective", "adapters_disabled", "base_key", "dpo_loss", "is_adapter_key",
    "objective_for", "orpo_loss", "sequence_log_probs", "token_cross_entropy",
]  # fmt: skip
