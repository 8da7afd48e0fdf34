"""Where a run's values go besides its log directory: the Weights & Biases and Comet settings (plain values, light to
import)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WandbSettings:
    """Where a run's values go in Weights & Biases (exp_manager.wandb_logger_kwargs)."""

    project: str | None = None
    name: str | None = None
    group: str | None = None
    entity: str | None = None
    host: str | None = None


@dataclass(frozen=True)
class CometSettings:
    """Where a run's values go in Comet (exp_manager.comet_logger_kwargs)."""

    workspace: str | None = None
    project: str | None = None
    name: str | None = None
    tags: tuple[str, ...] = ()
    others: Mapping[str, Any] | None = None
