"""Point a model's attention at a context-parallel kernel (a sequence split across ranks).

The kernel itself lives in nxd-parallel (ring attention); a model only needs to hand it the query,
key and value of its part of the sequence, and the document ids when documents are masked: a mask
built from a non-contiguous part of the sequence would be wrong. transformers models look their
attention function up by name, so one is registered that calls the kernel the layer carries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .attention import ContextParallelAttention, CoreAttention
from .errors import ModelConfigError
from .gpt import GPTForCausalLM
from .hf_types import is_hf_model

if TYPE_CHECKING:
    from transformers import PreTrainedModel

HF_IMPLEMENTATION = "nxd_context_parallel"
DOCUMENTS_KWARG = "nxd_document_ids"
"""The keyword that carries document ids from `causal_lm_logits` to the attention function."""


def _hf_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function protocol; the causal mask of the local part is not used."""
    output = module.nxd_context_parallel(query, key, value, kwargs.get(DOCUMENTS_KWARG), scaling)
    return output.transpose(1, 2).contiguous(), None


def use_context_parallel(model: torch.nn.Module, attention: ContextParallelAttention) -> None:
    """Make every attention layer of `model` (either family) call `attention`. Attention dropout
    is refused: the kernel has none."""
    if isinstance(model, GPTForCausalLM):
        if (window := model.config.sliding_window) is not None and window < model.config.seq_length:
            raise ModelConfigError(
                f"model.sliding_window_size: ring attention has no sliding window; expected null "
                f"or at least the sequence length ({model.config.seq_length}) with context "
                f"parallelism, found {window}"
            )
        if model.config.attention_dropout:
            raise ModelConfigError(
                f"model.attention_dropout: expected 0 with context parallelism (ring attention "
                f"has no dropout), found {model.config.attention_dropout}"
            )
        model.model.context_parallel = True
        for module in model.modules():
            if isinstance(module, CoreAttention):
                module.context_parallel = attention
        return
    if not is_hf_model(model):
        raise ModelConfigError(f"context parallelism: expected an nxd or transformers causal LM, found {type(model)}")
    if getattr(model.config, "sliding_window", None) is not None and getattr(model.config, "use_sliding_window", True):
        raise ModelConfigError(
            f"model.model_config: sliding_window {model.config.sliding_window}: ring attention has "
            "no sliding window; expected sliding_window null in config.json with context "
            "parallelism"
        )
    if getattr(model.config, "attention_dropout", 0.0):
        raise ModelConfigError(
            f"model.model_config.attention_dropout: expected 0 with context parallelism (ring "
            f"attention has no dropout), found {model.config.attention_dropout}"
        )
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if HF_IMPLEMENTATION not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(HF_IMPLEMENTATION, _hf_attention)
        AttentionMaskInterface.register(HF_IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    for layer in model.model.layers:
        if layer is not None:  # a pipeline stage holds some of them
            layer.self_attn.nxd_context_parallel = attention
    model.config._attn_implementation = HF_IMPLEMENTATION
    model.nxd_context_parallel = True  # recomputation may rename the implementation: a flag of its own


def hf_splits_sequence(model: PreTrainedModel) -> bool:
    """Whether `use_context_parallel` was applied to this transformers model."""
    return bool(getattr(model, "nxd_context_parallel", False))
