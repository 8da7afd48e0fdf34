"""Either family's incremental decoding: an empty cache, and the logits of tokens that continue it (a
transformers model keeps transformers' own `DynamicCache`; the Megatron-style decoder nxd's `KVCache`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .build import causal_lm_logits
from .distributed_types import is_dtensor
from .hf_types import is_hf_model
from .kv_cache import KVCache
from .moe import route_every_token

if TYPE_CHECKING:
    from transformers import DynamicCache


def prepare_for_decoding(model: nn.Module) -> nn.Module:
    """`model` in evaluation mode with every token routed (MoE layers drop none: a token's output must not depend
    on what else a forward holds, as it would with expert capacity)."""
    route_every_token(model)
    return model.eval()


def decoding_cache(model: nn.Module) -> KVCache | DynamicCache:
    """An empty cache for `model` (either family): nxd's for the Megatron-style decoder, transformers' own for a
    transformers model."""
    inner = getattr(model, "module", model)
    if not is_hf_model(inner):
        return KVCache()
    from transformers import DynamicCache

    return DynamicCache(config=inner.config)


def decoding_logits(
    model: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, cache: KVCache | DynamicCache | None
) -> torch.Tensor:
    """Logits (batch, seq, vocab) of tokens at `position_ids` that continue those `cache` holds (then added to
    it); without a cache, of a whole prefix starting at position 0."""
    if cache is None:
        return causal_lm_logits(model, input_ids, position_ids)
    inner = getattr(model, "module", model)
    if is_hf_model(inner):
        return model(input_ids=input_ids, position_ids=position_ids, past_key_values=cache, use_cache=True).logits
    return model(input_ids, position_ids, cache=cache)


def whole_logits(logits: torch.Tensor) -> torch.Tensor:
    """Whole logits on every rank (a tensor-parallel output layer leaves them split over the vocabulary)."""
    return logits.full_tensor() if is_dtensor(logits) else logits
