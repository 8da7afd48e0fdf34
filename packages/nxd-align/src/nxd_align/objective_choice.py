"""The objective a config's alignment method names: above both the token objective and the preference
objectives, so neither module imports the other."""

from __future__ import annotations

from typing import Any

from .grpo import GRPOObjective
from .kto import KTOObjective
from .objectives import Objective, TokenObjective
from .preference import DPOObjective, ORPOObjective
from .reward import RewardObjective

PREFERENCE_OBJECTIVES = {"dpo": DPOObjective, "orpo": ORPOObjective, "kto": KTOObjective}


def objective_for(method: str | None, **settings: Any) -> Objective:
    """The objective of an alignment method (`model_alignment_strategy`): None pretrains, "sft"
    fine-tunes on responses, "dpo", "orpo" and "kto" train on preference data with their `settings`
    (beta, and each method's own: DPO's loss_type ..., KTO's weights), "reward_model" trains a score
    head on preference pairs (its z_loss), "grpo" trains on the completions a run samples (GRPOObjective's
    settings)."""
    if method is None:
        return TokenObjective()
    if method == "sft":
        return TokenObjective("sft")
    if method in PREFERENCE_OBJECTIVES and "beta" in settings:
        return PREFERENCE_OBJECTIVES[method](**settings)
    if method == "reward_model":
        return RewardObjective(**settings)
    if method == "grpo":
        return GRPOObjective(**settings)
    raise ValueError(
        f"model_alignment_strategy: expected sft, dpo, orpo, kto (with beta), reward_model, grpo or no "
        f"method, found {method!r}"
    )
