"""nxd_align: objectives (pretraining and SFT token cross-entropy, DPO and ORPO on preference pairs, KTO on
labelled examples, GRPO on sampled completions and their advantages), the reference log-probs they compare
against, and LoRA adapters."""

from importlib.metadata import version as _distribution_version

from .advantages import Advantages, weighted_rewards
from .grpo import ADVANTAGE_KEY, OLD_KEY, REFERENCE_TOKENS_KEY, GRPOObjective, kl_estimate
from .kto import KL_KEY, KTOObjective, kl_baseline, kto_loss
from .lora import LoraConfigError, LoraFamily, LoraSpec, adapters_disabled, base_key, is_adapter_key
from .objective_choice import objective_for
from .objectives import IGNORE_INDEX, Objective, TokenObjective
from .preference import DPOObjective, ORPOObjective, dpo_loss, orpo_loss, sequence_log_probs
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
from .reward import RewardObjective, reward_loss

__version__ = _distribution_version("nxd-align")  # one source: the pyproject's version

__all__ = [
    "ADVANTAGE_KEY",
    "IGNORE_INDEX",
    "KL_KEY",
    "OLD_KEY",
    "REFERENCE_KEY",
    "REFERENCE_TOKENS_KEY",
    "TABLE_FILE",
    "Advantages",
    "DPOObjective",
    "GRPOObjective",
    "KTOObjective",
    "LoraConfigError",
    "LoraFamily",
    "LoraSpec",
    "ORPOObjective",
    "Objective",
    "ReferenceError",
    "RewardObjective",
    "RowLogProbs",
    "TokenObjective",
    "WithReference",
    "adapters_disabled",
    "base_key",
    "dpo_loss",
    "is_adapter_key",
    "kl_baseline",
    "kl_estimate",
    "kto_loss",
    "load_reference",
    "objective_for",
    "orpo_loss",
    "reference_digest",
    "reward_loss",
    "save_reference",
    "sequence_log_probs",
    "weighted_rewards",
]
