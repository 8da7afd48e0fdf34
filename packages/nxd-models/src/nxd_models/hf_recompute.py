"""Selective recomputation of a transformers model's attention core (NxDT's `CoreAttention`).

A transformers decoder computes softmax(QK^T)V in a function looked up by name
(`config._attn_implementation`), not in a module, so there is no module to checkpoint. This
registers a recomputed variant of the model's attention function (and the same mask builder) under
a new name and points the model at it: the attention probabilities are then rebuilt in backward
instead of kept, while the projections around them keep their activations.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.checkpoint import checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _attention_function(model: PreTrainedModel, implementation: str) -> Callable[..., Any]:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if implementation == "eager":  # each model family defines its own eager function
        return sys.modules[type(model).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[implementation]


def recompute_core_attention(model: PreTrainedModel) -> None:
    """Make every attention layer of `model` recompute its attention core in backward. One variant is
    registered per model family and attention function (nxd's SDPA variants carry their kernel), and shared
    by the models using it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    implementation = model.config._attn_implementation
    if implementation.startswith("nxd_recompute_"):
        return
    name = f"nxd_recompute_{model.config.model_type}_{implementation}"
    if name not in ALL_ATTENTION_FUNCTIONS:
        inner = _attention_function(model, implementation)  # nxd's SDPA variants choose their kernel per call

        def recomputed(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            def core(*inputs: Any) -> Any:
                return inner(module, *inputs, **kwargs)

            return checkpoint(core, *args, use_reentrant=False)

        AttentionInterface.register(name, recomputed)
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[implementation])
    model.config._attn_implementation = name
