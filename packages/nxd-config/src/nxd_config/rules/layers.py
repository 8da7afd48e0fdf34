"""model.attention_layers: a kind per layer, and what each kind refuses or leaves unread."""

from __future__ import annotations

from collections.abc import Iterator

from ..schema import NxdConfig
from ..schema.model import GATED_ACTIVATIONS
from .findings import CP, GATING, PP, SP, Finding, error, notice


def attention_layers(c: NxdConfig) -> Iterator[Finding]:
    m, key = c.model, "model.attention_layers"
    if c.model_source != "megatron":
        return
    kinds = set(m.attention_layers or ())
    if m.attention_layers is not None and m.num_layers is not None and len(m.attention_layers) != m.num_layers:
        yield error(
            key,
            f"expected one kind per layer (num_layers: {m.num_layers}), found {len(m.attention_layers)}",
            key,
            "model.num_layers",
        )
    unique, layers = m.num_unique_layers, m.num_layers
    if unique is not None and layers is not None and (unique > layers or layers % unique):
        yield error(
            "model.num_unique_layers",
            f"expected a divisor of num_layers ({layers}), found {unique}",
            "model.num_unique_layers",
            "model.num_layers",
        )
    if unique is not None and unique != layers and c.distributed_strategy.pipeline_model_parallel_size > 1:
        yield error(
            "model.num_unique_layers",
            f"a shared layer runs at several positions, which pipeline stages "
            f"would hold apart; expected {PP} 1, found {c.distributed_strategy.pipeline_model_parallel_size}",
            "model.num_unique_layers",
            PP,
        )
    if unique is not None and unique != layers and c.distributed_strategy.sequence_parallel:
        yield error(
            "model.num_unique_layers",
            f"sequence parallelism splits the sequence as the first layer begins, "
            f"and a shared first layer begins at several positions; expected {SP} false with it, found true",
            "model.num_unique_layers",
            SP,
        )
    if unique is not None and unique != layers and m.moe is not None:
        yield error(
            "model.moe",
            "MoE layers are counted over the stack's positions, and model.num_unique_layers "
            "shares layers between positions; expected one of them unset",
            "model.moe",
            "model.num_unique_layers",
        )
    if unique is not None and unique != layers and m.attention_layers is not None:
        yield error(
            key,
            "a kind per layer, and model.num_unique_layers shares layers; expected one of them unset",
            key,
            "model.num_unique_layers",
        )
    if unique is None and m.is_set("param_sharing_style"):
        yield notice(
            "model.param_sharing_style",
            "acted on only with model.num_unique_layers; without it every layer has its own weights",
            "model.param_sharing_style",
            "model.num_unique_layers",
        )
    sparse = sorted(kinds - {"dense", "mamba", "rwkv", *GATING})
    if sparse and c.distributed_strategy.context_parallel_size > 1:
        yield error(
            key,
            f"{', '.join(sparse)} layers attend by a block layout, which ring attention does not take; "
            f"expected {CP} 1, found {c.distributed_strategy.context_parallel_size}",
            key,
            CP,
        )
    gating, ds = ", ".join(sorted(kinds & set(GATING))), c.distributed_strategy
    mixing = f"{gating} layers mix every position of the sequence through one weight matrix"
    if gating and ds.context_parallel_size > 1:
        yield error(
            key,
            f"{mixing}, which context parallelism splits over ranks; expected {CP} 1, found {ds.context_parallel_size}",
            key,
            CP,
        )
    if gating and ds.sequence_parallel:
        yield error(
            key, f"{mixing}, which sequence parallelism splits over ranks; expected {SP} false, found true", key, SP
        )
    if gating and m.activation in GATED_ACTIVATIONS:
        yield error(
            "model.activation",
            f"{gating} layers split their inner activations into a value and a gate "
            f"themselves; expected an ungated activation, found {m.activation}",
            "model.activation",
            key,
        )
    if gating and m.moe is not None:
        yield error(
            "model.moe",
            f"{gating} layers have no MLP to replace with experts; expected one of model.moe and those layers",
            "model.moe",
            key,
        )
    scanning = ", ".join(sorted(kinds & {"mamba", "rwkv"}))
    if scanning and m.fusions.torch_compile:
        yield notice(
            "model.fusions.torch_compile",
            f"{scanning} layers scan the sequence one step at a time in "
            "Python: torch.compile unrolls every step, so compiling takes longer the longer the sequence",
            "model.fusions.torch_compile",
            key,
        )
    if scanning:
        for size, path, found in (
            (ds.context_parallel_size > 1, CP, ds.context_parallel_size),
            (ds.sequence_parallel, SP, "true"),
        ):
            if size:
                yield error(
                    key,
                    f"{scanning} layers scan the whole sequence from its start, which "
                    f"{'context' if path == CP else 'sequence'} parallelism splits over ranks; expected "
                    f"{path} {1 if path == CP else 'false'}, found {found}",
                    key,
                    path,
                )
        if m.moe is not None:
            yield error(
                "model.moe",
                f"{scanning} layers have no MLP to replace with experts; expected one of model.moe and those layers",
                "model.moe",
                key,
            )
        if m.soft_prompt is not None:
            yield error(
                "model.soft_prompt",
                f"every packed document sees the prompt's positions, which {scanning} "
                f"layers' scan cannot give; expected no soft prompt with them",
                "model.soft_prompt",
                key,
            )
    for kind, names in (
        ("mamba", ("mamba_inner_size", "mamba_conv_bias", "mamba_linear_bias")),
        ("rwkv", ("rwkv_dim_att", "rwkv_ffn_size")),
    ):
        for name in names:
            if kind not in kinds and m.is_set(name):
                yield notice(
                    f"model.{name}",
                    f"acted on only by {kind} layers (model.attention_layers); with none it changes nothing",
                    f"model.{name}",
                    key,
                )
    width = m.rwkv_dim_att or m.hidden_size
    if "rwkv" in kinds and width and m.num_attention_heads and width % m.num_attention_heads:
        yield error(
            "model.rwkv_dim_att",
            f"an rwkv layer's time mix has num_attention_heads heads; expected a "
            f"multiple of {m.num_attention_heads}, found {width}",
            "model.rwkv_dim_att",
            "model.num_attention_heads",
        )
    if "amlp" not in kinds and m.is_set("gmlp_attention_dim"):
        yield notice(
            "model.gmlp_attention_dim",
            "acted on only by amlp layers (model.attention_layers); with none it changes nothing",
            "model.gmlp_attention_dim",
            key,
        )
    if not sparse and m.is_set("sparse_attention"):
        yield notice(
            "model.sparse_attention",
            "acted on only by sparse layers (model.attention_layers); with none it changes nothing",
            "model.sparse_attention",
            key,
        )
