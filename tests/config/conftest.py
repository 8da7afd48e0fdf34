"""A minimal valid config that each test mutates in one place."""

import copy
from typing import Any

import pytest

MINIMAL: dict[str, Any] = {
    "trainer": {"devices": 4, "num_nodes": 1, "max_steps": 10},
    "distributed_strategy": {"tensor_model_parallel_size": 2},
    "data": {"micro_batch_size": 1, "global_batch_size": 4},
    "model": {
        "encoder_seq_length": 128,
        "num_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "optim": {"name": "adamw", "lr": 1e-3},
    },
    "precision": {"type": "fp32"},
}


@pytest.fixture
def minimal() -> dict[str, Any]:
    return copy.deepcopy(MINIMAL)


def messages(error: Exception) -> list[str]:
    """The rendered issues of a ConfigError, one string each (without the source)."""
    return [issue.render() for issue in error.issues]  # type: ignore[attr-defined]
