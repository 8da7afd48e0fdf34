"""A pipeline stage of either family: the same module tree with the other stages' parts removed (set
to None), so every parameter keeps its whole-model name (`model.layers.7.mlp...`) and checkpoints,
initialisation and TP plans read the same at any pipeline layout."""

from __future__ import annotations

from torch import nn

from .errors import ModelConfigError
from .gpt import GPTForCausalLM
from .hf_pipeline import hf_stage_problems, make_hf_stage
from .hf_types import is_hf_model


def keep_pipeline_stage(model: nn.Module, layers: range, *, first: bool, last: bool) -> nn.Module:
    """Remove from `model` (in place, on the meta device or not) everything outside its stage:
    decoder layers outside `layers`, the embeddings unless `first`, the final norm and output layer
    unless `last`. The stage's forward then maps input ids (first) or the residual stream (others) to
    logits (last) or the residual stream (others)."""
    if not (first and last) and (problems := pipeline_stage_problems(model)):
        raise ModelConfigError(*problems)
    decoder = model.model
    for index in range(len(decoder.layers)):
        if index not in layers:
            decoder.layers[index] = None
    if not first:
        decoder.embed_tokens = None
        if hasattr(decoder, "position_embeddings"):
            decoder.position_embeddings = None
    if not last:
        decoder.norm = None
        model.lm_head = None
    return make_hf_stage(model) if is_hf_model(model) else model


def pipeline_stage_problems(model: nn.Module) -> list[str]:
    """Why `model` cannot be cut into pipeline stages (empty when it can); the model is unchanged."""
    if is_hf_model(model):
        return hf_stage_problems(model)
    if not isinstance(model, GPTForCausalLM):
        return [f"pipeline parallelism: expected an nxd or transformers causal LM, found {type(model).__name__}"]
    if model.lm_head.weight is model.model.embed_tokens.weight:  # tied (a score head never is)
        return [
            "model.share_embeddings_and_output_weights: expected False with pipeline parallelism (the "
            "embedding and the output layer live on different stages), found True"
        ]
    if model.config.soft_prompt_tokens:
        return [
            "model.soft_prompt: the prompt enters before the first stage's layers and the last stage drops its "
            "positions; expected pipeline_model_parallel_size 1 with it"
        ]
    if model.config.num_unique_layers not in (None, model.config.num_layers):
        return [
            "model.num_unique_layers: a shared layer runs at several positions, which pipeline stages would hold "
            "apart; expected pipeline_model_parallel_size 1 with it"
        ]
    if model.config.position_embedding_type == "rpe":
        return [
            "model.position_embedding_type: rpe's one table serves every layer, so its stages would each train "
            "a copy that drifts apart (as GPT-NeoX's do); expected pipeline_model_parallel_size 1 with rpe"
        ]
    return []


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers `model` holds (a pipeline stage holds some of them)."""
    return [layer for layer in model.model.layers if layer is not None]
