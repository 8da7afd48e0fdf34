"""The objective a config's alignment method names: above both the token objective and the preference
objectives, so neither module imports the other."""

from __future__ import annotations

from typing import Any

from .kto import KTOObjective
from .objectives import Objective, TokenObjective
from .preference import DPOObjective, ORPOObjective

PREFERENCE_OBJECTIVES = {"dpo": DPOObjective, "orpo": ORPOObjective, "kto": KTOObjective}


def objective_for(method: str | None, **settings: Any) -> Objective:
    """The objective of an alignment method (`model_alignment_strategy`): None pretrains, "sft"
    fine-tunes on responses, "dpo", "orpo" and "kto" train on preference data with their `settings`
    (beta, and each method's own: DPO's loss_type ..., KTO's weights)."""
    if method is None:
        return TokenObjective()
    if method == "sft":
        return TokenObjective("sft")
    if method in PREFERENCE_OBJECTIVES and "beta" in settings:
        return PREFERENCE_OBJECTIVES[method](**settings)
    raise ValueError(f"model_alignment_strategy: expected sft, dpo, orpo or kto (with beta) or no method, found "
                     f"{method!r}")
