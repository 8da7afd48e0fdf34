"""Build either model family on the meta device, then materialise it once where it will live."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from .attention import _FAST_BACKENDS, MASKED_ROWS_UP_TO, AttentionKernel, document_spans, span_attention
from .context_parallel import DOCUMENTS_KWARG, hf_splits_sequence
from .gpt import GPTConfig, GPTForCausalLM
from .hf_types import import_model_classes, is_hf_model
from .initialisation import InitModule, init_rule, initial_values, seed_or_drawn
from .score_head import check_head, use_score_head

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

HF_SDPA = "nxd_sdpa"
"""transformers' SDPA attention under the model's kernel choice (registered as `nxd_sdpa_<kernel>`), with packed
documents attended span by span."""
SPANS_KWARG = "nxd_document_spans"


def _sdpa_function(kernel: AttentionKernel) -> Callable[..., tuple[torch.Tensor, None]]:
    """transformers' attention-function protocol for `kernel`: its own SDPA, or `span_attention` over the
    document spans `causal_lm_logits` passes (the mask is then not used). The kernel is chosen inside each
    call, not around the model's forward: activation recompute replays the call in backward, outside any
    context the forward ran in, and must pick the kernel the forward did."""

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attend(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        spans = kwargs.pop(SPANS_KWARG, None)
        with sdpa_kernel_of(kernel):
            if spans is None:
                return sdpa_attention_forward(
                    module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
                )
            attended = span_attention(query, key, value, spans, dropout=dropout, scale=scaling)
        return attended.transpose(1, 2).contiguous(), None

    return attend


def _use_span_sdpa(model: PreTrainedModel, kernel: AttentionKernel) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = f"{HF_SDPA}_{kernel}"
    if name not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(name, _sdpa_function(kernel))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model.config._attn_implementation = name
    model.nxd_document_spans = True


def build_on_meta(
    spec: GPTConfig | PretrainedConfig, attention: AttentionKernel = AttentionKernel.FLASH, head: str = "causal_lm"
) -> nn.Module:
    """The module tree of either family on the meta device: shapes and names, no memory; with `head`
    "score", a reward model's score head in place of the LM head. Shard it, then materialise it
    (nxd-parallel), or use `build_causal_lm` for a whole model."""
    check_head(head)
    model = _meta_tree(spec, attention)
    if not isinstance(spec, GPTConfig):
        from .hf_qkv import use_qkv_linear

        model = use_qkv_linear(model)
    return use_score_head(model) if head == "score" else model


TORCH_INIT = {name: getattr(nn.init, name) for name in dir(nn.init) if name.endswith("_") and not name.startswith("_")}
"""torch.nn.init's in-place functions as torch defines them, taken when nxd-models is imported."""


@contextlib.contextmanager
def _no_initialisation() -> Iterator[None]:
    """torch.nn.init's functions do nothing inside: a meta tensor has no values to fill, and torch fills one
    through a decomposition whose first call imports torch._dynamo (seconds, for a tree never computed on).
    Initial values come later, module by module (`initial_values`); torch's own functions are back on leaving,
    however the block ends."""
    try:
        for name in TORCH_INIT:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, function in TORCH_INIT.items():
            setattr(nn.init, name, function)


def _meta_tree(spec: GPTConfig | PretrainedConfig, attention: AttentionKernel) -> nn.Module:
    """The meta tree with a transformers model's own q/k/v layers (its initialisation knows those)."""
    if isinstance(spec, GPTConfig):
        with torch.device("meta"), _no_initialisation():
            return GPTForCausalLM(spec, attention)
    # imported before the meta build: transformers' initialisation calls the torch.nn.init functions it finds at
    # import (TORCH_INIT_FUNCTIONS), which must be torch's, not `_no_initialisation`'s stand-ins
    import_model_classes()
    from transformers import AutoModelForCausalLM

    from .hf_moe import use_moe_layers

    with torch.device("meta"), _no_initialisation():
        implementation = "eager" if attention is AttentionKernel.UNFUSED else "sdpa"
        # a config of its own: transformers writes the attention choice into it, and nxd may change that
        model = AutoModelForCausalLM.from_config(
            copy.deepcopy(spec), attn_implementation=implementation, dtype=torch.float32
        )
        use_moe_layers(model)
        if implementation == "sdpa":
            _use_span_sdpa(model, attention)
        return model


def build_causal_lm(
    spec: GPTConfig | PretrainedConfig,
    device: torch.device | str = "cpu",
    *,
    seed: int | None = None,
    use_cpu_initialization: bool = True,
    attention: AttentionKernel = AttentionKernel.FLASH,
    head: str = "causal_lm",
) -> nn.Module:
    """A randomly initialised causal LM with fp32 parameters on `device`.

    The module tree is created on the meta device (no memory), then initialised module by module from
    `seed` (`initial_values`; None: a seed drawn from the torch RNG): on the CPU and moved
    (`use_cpu_initialization`, values independent of the device's RNG) or directly on `device`.
    `attention` is the attention kernel of either family (the fusions keys); `head` as `build_on_meta`.
    """
    seed = seed_or_drawn(seed)  # before the meta build, whatever it draws
    return initialise(
        build_on_meta(spec, attention, head),
        seed=seed,
        device=torch.device(device),
        use_cpu_initialization=use_cpu_initialization,
    )


def initialise(
    model: nn.Module,
    *,
    seed: int,
    device: torch.device,
    use_cpu_initialization: bool = True,
    rule: InitModule | None = None,
) -> nn.Module:
    """Meta tree `model` (of either family, possibly adapted) with its initial values from `seed`
    under `rule` (the family's when None), on `device`."""
    where = torch.device("cpu") if use_cpu_initialization else device
    for _ in initial_values(model, rule or init_rule(model), seed=seed, device=where, keep=True):
        pass
    return model.to(device)


@contextlib.contextmanager
def sdpa_kernel_of(attention: AttentionKernel) -> Iterator[None]:
    """The SDPA backends `attention` allows: the fused ones for FLASH, the math one otherwise."""
    with sdpa_kernel(_FAST_BACKENDS if attention is AttentionKernel.FLASH else [SDPBackend.MATH]):
        yield


def hf_attention_inputs(
    model: PreTrainedModel, shape: torch.Size, document_ids: torch.Tensor | None, device: torch.device
) -> tuple[Any, dict[str, Any]]:
    """What transformers' decoder layers of `model` take for a micro-batch of `shape` (batch, whole
    sequence): the attention mask (one, or one per layer type as `config.layer_types` names them;
    None where SDPA's causal kernel needs none) and extra attention keywords.

    Without documents attention is causal over the whole row. With them a context-parallel attention
    masks documents from their ids, the span kernel takes each document's span (when every document is
    one run, no sliding window is shorter than the longest document and the rows are longer than
    `MASKED_ROWS_UP_TO`), and otherwise the masks are
    causal within each document, sliding windows kept."""
    if document_ids is not None and hf_splits_sequence(model):
        return None, {DOCUMENTS_KWARG: document_ids}
    if (
        document_ids is not None
        and getattr(model, "nxd_document_spans", False)
        and shape[-1] > MASKED_ROWS_UP_TO
        and (spans := document_spans(document_ids)) is not None
        and not _window_applies(model.config, max(end - start for row in spans for start, end in row))
    ):
        return None, {SPANS_KWARG: spans}
    from transformers.masking_utils import LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING, packed_sequence_mask_function

    # transformers reads batch, length, dtype (of an additive eager mask) and device from it
    shape_only = torch.empty(*shape, 0, dtype=model.dtype, device=device)
    documents = None if document_ids is None else packed_sequence_mask_function(document_ids)
    masks = {
        kind: LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING[kind](
            config=model.config,
            inputs_embeds=shape_only,
            attention_mask=None,
            past_key_values=None,
            and_mask_function=documents,
        )
        for kind in set(layer_mask_kinds(model.config))
    }
    return masks if getattr(model.config, "layer_types", None) else next(iter(masks.values())), {}


def layer_mask_kinds(config: PretrainedConfig) -> list[str]:
    """Each decoder layer's mask kind, as the model's own forward picks it: `layer_types` (Qwen2,
    Qwen3), Mistral's (and Mixtral's) sliding window on every layer, or full causal attention (Llama keeps that
    whatever a stray `sliding_window` in its config.json says)."""
    if types := getattr(config, "layer_types", None):
        return list(types)
    sliding = config.model_type in ("mistral", "mixtral") and config.sliding_window is not None
    return ["sliding_attention" if sliding else "full_attention"] * config.num_hidden_layers


def _window_applies(config: PretrainedConfig, seq: int) -> bool:
    """Whether some layer of a transformers model sees a sliding window shorter than `seq`."""
    window = getattr(config, "sliding_window", None)
    return window is not None and window < seq and "sliding_attention" in layer_mask_kinds(config)


def causal_lm_logits(
    model: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, document_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Logits (batch, seq, vocab) of either family; a DDP/FSDP wrapper around the model is fine.

    `document_ids` (batch, seq), when given, restricts attention to earlier tokens of the same
    document (Megatron's reset_attention_mask); otherwise attention is causal over the whole sample,
    whatever the position ids (transformers would otherwise read restarting positions as packed
    sequences and mask across them).
    """
    inner = getattr(model, "module", model)
    if is_hf_model(inner):
        masks, extra = hf_attention_inputs(inner, input_ids.shape, document_ids, input_ids.device)
        if masks is None:  # SDPA's causal kernel; ones keep transformers from reading restarting positions as
            masks = torch.ones_like(input_ids)  # packed sequences
        return model(
            input_ids=input_ids, position_ids=position_ids, attention_mask=masks, use_cache=False, **extra
        ).logits
    return model(input_ids, position_ids, document_ids)
