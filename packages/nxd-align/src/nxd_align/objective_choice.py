"""The objective a config's alignment method names: above both the token objective and the preference
objectives, so neither module imports the other."""

from __future__ import annotations

from .objectives import Objective, TokenObjective
from .preference import DPOObjective, ORPOObjective


def objective_for(method: str | None, beta: float | None = None) -> Objective:
    """The objective of an alignment method (`model_alignment_strategy`): None pretrains, "sft"
    fine-tunes on responses, "dpo" and "orpo" (with their `beta`) train on preference pairs."""
    if method is None:
        return TokenObjective()
    if method == "sft":
        return TokenObjective("sft")
    if method in ("dpo", "orpo") and beta is not None:
        return (DPOObjective if method == "dpo" else ORPOObjective)(beta)
    raise ValueError(f"model_alignment_strategy: expected sft, dpo or orpo (with beta) or no method, found {method!r}")
