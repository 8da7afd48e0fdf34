"""A pipeline stage of a transformers causal LM.

transformers' own forward runs every layer from input ids to logits; a stage holds some layers (the
others set to None, as the Megatron-style stages), and the first also the embedding, the last the
final norm and output layer. Its forward, set on the instance by `make_hf_stage`, takes input ids
(first stage) or the residual stream and returns the residual stream or logits (last stage; with
`labels`, the per-token cross-entropy), calling
transformers' decoder layers as its model does: the rotary embedding of the position ids, each
layer's mask kind, and the attention inputs `causal_lm_logits` uses, built from the whole row's
positions, since under sequence parallelism a later stage receives a sequence shard.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import MethodType
from typing import TYPE_CHECKING

import torch

from .build import hf_attention_inputs, layer_mask_kinds
from .score_head import ScoreHead
from .token_losses import LOSS_TEMPERATURE, chunked_token_cross_entropy

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _stage_forward(
    self: PreTrainedModel,
    inputs: torch.Tensor,
    position_ids: torch.Tensor,
    document_ids: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
) -> torch.Tensor:
    decoder = self.model
    hidden = inputs if decoder.embed_tokens is None else decoder.embed_tokens(inputs)
    masks, extra = hf_attention_inputs(self, position_ids.shape, document_ids, hidden.device)
    kinds = layer_mask_kinds(self.config)
    rotary = decoder.rotary_emb(hidden, position_ids)
    for index, layer in enumerate(decoder.layers):
        if layer is not None:
            mask = masks[kinds[index]] if isinstance(masks, dict) else masks
            hidden = layer(
                hidden,
                attention_mask=mask,
                position_embeddings=rotary,
                position_ids=position_ids,
                past_key_values=None,
                use_cache=False,
                **extra,
            )
    if decoder.norm is not None:
        hidden = decoder.norm(hidden)
    if self.lm_head is None:
        return hidden
    if labels is None:
        return self.lm_head(hidden)
    if isinstance(self.lm_head, ScoreHead):
        return self.lm_head.scores(hidden)
    chunk = getattr(self, "nxd_loss_chunk_tokens", 0)  # the family's loss_chunk_tokens
    temperature = getattr(self, LOSS_TEMPERATURE, 1.0)  # online RL's sampling temperature
    return chunked_token_cross_entropy(hidden, self.lm_head, labels, chunk, temperature)  # the counted positions only


@contextlib.contextmanager
def stage_forward(model: PreTrainedModel) -> Iterator[None]:
    """`model` (a whole transformers causal LM) called with the stage forward while the context lasts
    (a stage keeps its own): its per-token losses come from the final hidden states and the output
    layer on the counted positions only, never transformers' whole logits. The module is still
    called as itself, so the hooks data parallelism puts on it run."""
    if "forward" in vars(model):  # a pipeline stage: the stage forward already
        yield
        return
    model.forward = MethodType(_stage_forward, model)
    try:
        yield
    finally:
        del model.forward


def make_hf_stage(model: PreTrainedModel) -> PreTrainedModel:
    """Give `model` (already reduced to its stage's parts) the stage forward described above."""
    model.forward = MethodType(_stage_forward, model)
    return model


def hf_stage_problems(model: PreTrainedModel) -> list[str]:
    """Why a transformers model cannot be cut into pipeline stages (empty when it can)."""
    if model.config.tie_word_embeddings:
        return [
            "model.model_config: tie_word_embeddings: expected false in config.json with pipeline parallelism "
            "(the embedding and the output layer live on different stages), found true"
        ]
    return []
