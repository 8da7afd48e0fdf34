"""Build either model family on the meta device, then materialise it once where it will live."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import (
    ALL_MASK_ATTENTION_FUNCTIONS,
    AttentionMaskInterface,
    create_causal_mask,
    packed_sequence_mask_function,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .attention import _FAST_BACKENDS, AttentionKernel, document_spans, span_attention
from .context_parallel import DOCUMENTS_KWARG, hf_splits_sequence
from .gpt import GPTConfig, GPTForCausalLM
from .hf_qkv import use_qkv_linear

HF_SDPA = "nxd_sdpa"
"""transformers' SDPA attention, with packed documents attended span by span."""
SPANS_KWARG = "nxd_document_spans"


def _sdpa_with_spans(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs) -> tuple[torch.Tensor, None]:  # fmt: skip
    """transformers' attention-function protocol: its own SDPA, or `span_attention` over the document
    spans `causal_lm_logits` passes (the mask is then not used)."""
    spans = kwargs.pop(SPANS_KWARG, None)
    if spans is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)  # fmt: skip
    return span_attention(query, key, value, spans, dropout=dropout, scale=scaling).transpose(1, 2).contiguous(), None


def _use_span_sdpa(model: PreTrainedModel) -> None:
    if HF_SDPA not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(HF_SDPA, _sdpa_with_spans)
        AttentionMaskInterface.register(HF_SDPA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model.config._attn_implementation = HF_SDPA
    model.nxd_document_spans = True


def build_on_meta(spec: GPTConfig | PretrainedConfig, attention: AttentionKernel = AttentionKernel.FLASH) -> nn.Module:
    """The module tree of either family on the meta device: shapes and names, no memory. Shard it,
    then materialise it (nxd-parallel), or use `build_causal_lm` for a whole model."""
    model = _transformers_layout_on_meta(spec, attention)
    return model if isinstance(spec, GPTConfig) else use_qkv_linear(model)


def _transformers_layout_on_meta(spec: GPTConfig | PretrainedConfig, attention: AttentionKernel) -> nn.Module:
    """The meta tree with a transformers model's own q/k/v layers (its initialisation knows those)."""
    with torch.device("meta"):
        if isinstance(spec, GPTConfig):
            return GPTForCausalLM(spec, attention)
        implementation = "eager" if attention is AttentionKernel.UNFUSED else "sdpa"
        # a config of its own: transformers writes the attention choice into it, and nxd may change that
        model = AutoModelForCausalLM.from_config(copy.deepcopy(spec), attn_implementation=implementation,
                                                 dtype=torch.float32)  # fmt: skip
        model.nxd_attention = attention
        if implementation == "sdpa":
            _use_span_sdpa(model)
        return model


def build_causal_lm(
    spec: GPTConfig | PretrainedConfig,
    device: torch.device | str = "cpu",
    *,
    use_cpu_initialization: bool = True,
    attention: AttentionKernel = AttentionKernel.FLASH,
) -> nn.Module:
    """A randomly initialised causal LM with fp32 parameters on `device`.

    The module tree is created on the meta device (no memory), then each parameter is allocated once:
    on the CPU and moved (`use_cpu_initialization`, values independent of the device's RNG) or directly
    on `device`. `attention` is the attention kernel of either family (the fusions keys).
    """
    device = torch.device(device)
    model = _transformers_layout_on_meta(spec, attention)
    model.to_empty(device=torch.device("cpu") if use_cpu_initialization else device)
    if isinstance(spec, GPTConfig) and spec.share_embeddings_and_output_weights:
        model.lm_head.weight = model.model.embed_tokens.weight  # to_empty allocated the two apart
    model.init_weights()
    if not isinstance(spec, GPTConfig):  # the QKV module takes the q/k/v values transformers drew
        use_qkv_linear(model)
    return model.to(device)


@contextlib.contextmanager
def sdpa_kernel_of(attention: AttentionKernel | None) -> Iterator[None]:
    """The SDPA backends an HF model's `nxd_attention` asks for (no restriction for None or UNFUSED)."""
    if attention is None or attention is AttentionKernel.UNFUSED:
        yield
        return
    with sdpa_kernel(_FAST_BACKENDS if attention is AttentionKernel.FLASH else [SDPBackend.MATH]):
        yield


def causal_lm_logits(model: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor,
                     document_ids: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """Logits (batch, seq, vocab) of either family; a DDP/FSDP wrapper around the model is fine.

    `document_ids` (batch, seq), when given, restricts attention to earlier tokens of the same
    document (Megatron's reset_attention_mask); otherwise attention is causal over the whole sample,
    whatever the position ids (transformers would otherwise read restarting positions as packed
    sequences and mask across them).
    """
    inner = getattr(model, "module", model)
    if isinstance(inner, PreTrainedModel):
        extra = {}
        if document_ids is None:
            mask = torch.ones_like(input_ids)
        elif hf_splits_sequence(inner):  # the attention masks documents from their ids
            mask, extra = torch.ones_like(input_ids), {DOCUMENTS_KWARG: document_ids}
        elif getattr(inner, "nxd_document_spans", False) and (spans := document_spans(document_ids)) is not None:
            mask, extra = torch.ones_like(input_ids), {SPANS_KWARG: spans}
        else:
            # transformers reads batch, length, dtype (of an additive eager mask) and device from it
            shape_only = torch.empty(*input_ids.shape, 0, dtype=inner.dtype, device=input_ids.device)
            mask = create_causal_mask(config=inner.config, inputs_embeds=shape_only, attention_mask=None,
                                      past_key_values=None,
                                      and_mask_function=packed_sequence_mask_function(document_ids))  # fmt: skip
        with sdpa_kernel_of(getattr(inner, "nxd_attention", None)):
            return model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, use_cache=False,
                         **extra).logits
    return model(input_ids, position_ids, document_ids)
