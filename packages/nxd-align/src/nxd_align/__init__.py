"""nxd_align: objectives (pretraining and SFT token cross-entropy, DPO and ORPO on preference pairs),
DPO's reference log-probs, and LoRA adapters."""

from .lora import LoraConfigError, LoraFamily, LoraSpec, adapters_disabled, base_key, is_adapter_key
from .objective_choice import objective_for
from .objectives import IGNORE_INDEX, Objective, TokenObjective
from .preference import (
    DPOObjective,
    ORPOObjective,
    PairObjective,
    PreferenceTerms,
    dpo_loss,
    orpo_loss,
    sequence_log_probs,
)
from .reference import (
    REFERENCE_KEY,
    TABLE_FILE,
    ReferenceError,
    RowLogProbs,
    WithReference,
    load_reference,
    reference_digest,
    save_reference,
)

__version__ = "0.1.0"

__all__ = [
    "IGNORE_INDEX", "REFERENCE_KEY", "TABLE_FILE", "DPOObjective", "LoraConfigError", "LoraFamily", "LoraSpec",
    "ORPOObjective", "Objective", "PairObjective", "PreferenceTerms", "ReferenceError", "RowLogProbs",
    "TokenObjective", "WithReference", "adapters_disabled", "base_key", "dpo_loss", "is_adapter_key",
    "load_reference", "objective_for", "orpo_loss", "reference_digest", "save_reference", "sequence_log_probs",
]  # fmt: skip
