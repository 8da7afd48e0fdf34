"""nxd_align: objectives (pretraining and SFT token cross-entropy), with DPO, ORPO and LoRA to come."""

from .objectives import IGNORE_INDEX, Objective, TokenObjective, objective_for, token_cross_entropy

__version__ = "0.1.0"

__all__ = ["IGNORE_INDEX", "Objective", "TokenObjective", "objective_for", "token_cross_entropy"]
