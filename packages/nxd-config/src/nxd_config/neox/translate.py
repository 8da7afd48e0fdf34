"""A merged GPT-NeoX argument set -> an NxDT-dialect config tree, with NeoX's rules and defaults.

Every key of the file is judged by its entry in `keys.NEOX_KEYS`: a notice key set away from NeoX's default
gets a notice, a refused one an error, and the mapped ones are translated here, group by group, each
reading its NeoX keys (with NeoX's defaults where the file is silent) and writing the nxd keys they
become. What NeoX derives while it runs (batch arithmetic, the MLP width, the attention layout, the
learning-rate horizon) is derived here the way NeoX derives it, so the tree holds plain values.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigIssue, show
from .keys import NEOX_KEYS, KeyStatus, NeoXKey

ATTENTION_KINDS = ("global", "local", "sparse_fixed", "sparse_variable", "bigbird", "bslongformer", "gmlp", "amlp",
                   "flash", "rwkv", "mamba")  # fmt: skip
DENSE_ATTENTION = ("global", "flash")
GATED = ("geglu", "reglu", "swiglu", "bilinear", "glu")
ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "softsign": "softsign", "swish": "silu", "silu": "silu",
               "mish": "mish", "geglu": "geglu", "reglu": "reglu", "swiglu": "swiglu", "bilinear": "bilinear",
               "glu": "glu"}  # fmt: skip
"""NeoX's activation names -> nxd's."""
NORMS = {"layernorm": "layernorm_epsilon", "rmsnorm": "rms_norm_epsilon", "scalenorm": "scalenorm_epsilon"}
POSITIONS = {"learned": "learned_absolute", "rotary": "rope", "sinusoidal": "sinusoidal", "alibi": "alibi",
             "none": "none"}  # fmt: skip
ADAM_PARAMS = {"lr", "betas", "eps", "amsgrad", "adam_w_mode", "bias_correction"}
SGD_PARAMS = {"lr", "momentum", "dampening", "nesterov"}
ZERO_TUNING = ("allgather_partitions", "allgather_bucket_size", "overlap_comm", "reduce_scatter", "reduce_bucket_size",
               "contiguous_gradients", "round_robin_gradients", "sub_group_size", "elastic_checkpoint",
               "load_from_fp32_weights", "stage3_max_live_parameters", "stage3_max_reuse_distance",
               "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")  # fmt: skip


@dataclass
class Translation:
    """What a NeoX argument set becomes: the NxDT tree, where each of its keys came from, notices and
    refusals (naming NeoX keys)."""

    tree: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Dotted nxd key -> the NeoX keys it was made from."""
    notices: list[str] = field(default_factory=list)
    issues: list[ConfigIssue] = field(default_factory=list)

    def set(self, path: str, value: Any, *keys: str) -> None:
        *parents, leaf = path.split(".")
        node = self.tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
        self.sources[path] = keys

    def claim(self, path: str, *keys: str) -> None:
        """Record that nxd key `path` stands for NeoX `keys` even where nothing was written to it."""
        self.sources.setdefault(path, keys)

    def refuse(self, key: str, message: str) -> None:
        self.issues.append(ConfigIssue(key, message))

    @property
    def refused(self) -> set[str]:
        """The NeoX keys (top level) some refusal names."""
        return {issue.path.partition(".")[0] for issue in self.issues}

    def notice(self, key: str, message: str) -> None:
        self.notices.append(f"{key}: {message}")


class Arguments:
    """The file's NeoX arguments over NeoX's defaults; remembers which keys were read."""

    def __init__(self, values: dict[str, Any]):
        self.values = values
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return self.values[key] if key in self.values else NEOX_KEYS[key].default

    def given(self, key: str) -> bool:
        return key in self.values and not is_default(self.values[key], NEOX_KEYS[key].default)


def is_default(value: Any, default: Any) -> bool:
    """Whether `value` asks for what NeoX's `default` gives: equal, an unset switch (null, false, an empty
    block) where the default is null, or a DeepSpeed block with enabled: false."""
    if isinstance(value, bool) != isinstance(default, bool) and default is not None:
        return False
    if value == default:
        return True
    if default is None and (value is None or value is False or value == {} or value == []):
        return True
    return default is None and isinstance(value, dict) and value.get("enabled") is False


def translate(values: dict[str, Any], name: str) -> Translation:
    """The NxDT tree of NeoX arguments `values` (canonical spellings); `name` names the run."""
    t = Translation()
    values = _with_extra_deepspeed_args(t, values)
    a = Arguments(values)
    for key, value in values.items():
        entry = NEOX_KEYS.get(key)
        if entry is None:
            close = difflib.get_close_matches(key, list(NEOX_KEYS), n=1, cutoff=0.7)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            t.refuse(key, f"unknown key; expected a GPT-NeoX argument{hint}")
        elif entry.status is not KeyStatus.MAPPED and not is_default(value, entry.default):
            _judge(t, entry, value)
    t.set("name", name)
    for group in (_model, _attention, _mlp, _moe, _parallel, _precision, _optimizer, _loop, _data, _tokenizer,
                  _checkpoints, _logging):  # fmt: skip
        group(a, t)
    return t


def _with_extra_deepspeed_args(t: Translation, values: dict[str, Any]) -> dict[str, Any]:
    """`deepspeed_extra_args` holds DeepSpeed config keys that NeoX passes on as they are: each is read as
    the DeepSpeed key of that name written at the top level."""
    extra = values.get("deepspeed_extra_args")
    if not isinstance(extra, dict):
        return values
    merged = {key: value for key, value in values.items() if key != "deepspeed_extra_args"}
    for key, value in extra.items():
        entry = NEOX_KEYS.get(key)
        if entry is None or entry.group != "DeepSpeed" or key == "deepspeed_extra_args":
            t.refuse(f"deepspeed_extra_args.{key}", "expected a DeepSpeed config key (such as comms_logger or "
                     "flops_profiler)")  # fmt: skip
        elif key in merged:
            t.refuse(f"deepspeed_extra_args.{key}", f"expected {key} once, found it at the top level too")
        else:
            merged[key] = value
    return merged


def _judge(t: Translation, entry: NeoXKey, value: Any) -> None:
    if entry.status is KeyStatus.NOTICE:
        t.notice(entry.name, f"accepted, changes nothing here: {entry.note}")
    else:
        t.refuse(entry.name, f"expected {show(entry.default)} (GPT-NeoX's default), found {show(value)}: {entry.note}")


def _typed(t: Translation, a: Arguments, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    """`key`'s value when it has the type the translation computes with, else an error and None."""
    value = a[key]
    if value is None or isinstance(value, kind) and not isinstance(value, bool):
        return value
    t.refuse(key, f"expected {what}, found {show(value)}")
    return None


def _choice(t: Translation, a: Arguments, key: str, choices: Iterable[str], refused: str = "") -> str | None:
    """`key`'s value (lower case, as NeoX compares choices) when it is one of `choices`, else an error."""
    value = a[key]
    text = value.lower() if isinstance(value, str) else value
    choices = list(choices)
    if text in choices:
        return text
    why = f": {refused}" if refused else ""
    t.refuse(key, f"expected one of {', '.join(choices)}, found {show(value)}{why}")
    return None


# --------------------------------------------------------------------------- model


def _model(a: Arguments, t: Translation) -> None:
    plain = {"num_layers": "model.num_layers", "hidden_size": "model.hidden_size",
             "num_attention_heads": "model.num_attention_heads", "num_kv_heads": "model.num_kv_heads",
             "seq_length": "model.encoder_seq_length", "max_position_embeddings": "model.max_position_embeddings",
             "init_method_std": "model.init_method_std",
             "make_vocab_size_divisible_by": "model.make_vocab_size_divisible_by",
             "apply_query_key_layer_scaling": "model.apply_query_key_layer_scaling",
             "use_cpu_initialization": "model.use_cpu_initialization", "hidden_dropout": "model.hidden_dropout",
             "attention_dropout": "model.attention_dropout", "init_method": "model.init_method",
             "output_layer_init_method": "model.output_layer_init_method",
             "use_bias_in_attn_linear": "model.attention_bias", "use_bias_in_mlp": "model.mlp_bias"}  # fmt: skip
    for key, path in plain.items():
        t.set(path, a[key], key)
    for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "max_position_embeddings"):
        if a[key] is None:
            t.refuse(key, "expected a value (GPT-NeoX requires it), found none")
    t.set("model.ffn_dropout", 0.0)
    t.set("model.share_embeddings_and_output_weights", not a["no_weight_tying"], "no_weight_tying")
    a["output_layer_parallelism"]  # column-parallel: what nxd's output layer is
    norm = _choice(t, a, "norm", NORMS, "non_parametric_layernorm and Transformer Engine's te_* norms are not in nxd")
    if norm is not None:
        t.set("model.normalization", norm, "norm")
        t.set("model.layernorm_epsilon", a[NORMS[norm]], NORMS[norm])
    for key in NORMS.values():
        a[key]
    position = _choice(t, a, "pos_emb", POSITIONS, "T5 relative buckets (rpe) are not in nxd")
    if position is not None:
        t.set("model.position_embedding_type", POSITIONS[position], "pos_emb")
    fraction, base = a["rotary_pct"], a["rotary_emb_base"]
    if position == "rotary":
        t.set("model.rotary_percentage", fraction, "rotary_pct")
        t.set("model.rope_theta", base, "rotary_emb_base")
    elif a.given("rotary_pct") or a.given("rotary_emb_base"):
        t.notice("rotary_pct", f"accepted, changes nothing here: pos_emb is {a['pos_emb']!r}, not rotary")
    residual, tied = a["gpt_j_residual"], a["gpt_j_tied"]
    t.set("model.transformer_block_type", ("gpt_j" if tied else "gpt_neox") if residual else "pre_ln",
          "gpt_j_residual", "gpt_j_tied")
    if tied and not residual:
        t.notice("gpt_j_tied", "accepted, changes nothing here: it ties the norms of gpt_j_residual blocks only")
    window = _typed(t, a, "sliding_window_width", int, "a whole number of tokens")
    if window is not None:
        t.set("model.sliding_window_size", window + 1, "sliding_window_width")


def _attention(a: Arguments, t: Translation) -> None:
    layers = a["num_layers"]
    kinds = expand_attention_config(t, a["attention_config"], layers if isinstance(layers, int) else None)
    if kinds is None:
        return
    other = sorted(set(kinds) - set(DENSE_ATTENTION))
    if other:
        t.refuse("attention_config", f"expected global or flash layers (dense causal attention), found "
                 f"{', '.join(other)}: nxd has no {', '.join(other)} layers")  # fmt: skip
    t.set("model.fusions.flash_attention", True, "attention_config")


def expand_attention_config(t: Translation, config: Any, layers: int | None) -> list[str] | None:
    """NeoX's attention_config expanded to one kind per layer (megatron/utils.py: expand_attention_types):
    [[kinds, n], ...] repeats each list n times; n "all" fills every layer with that pattern at once."""
    if config is None:
        return ["global"] * (layers or 0)
    key = "attention_config"
    if not isinstance(config, list):
        t.refuse(key, f"expected a list such as [[[\"global\"], num_layers]], found {show(config)}")
        return None
    if all(isinstance(item, str) for item in config):
        kinds = list(config)
    else:
        kinds = []
        for item in config:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], list)):
                t.refuse(key, f"expected items [[kinds ...], count], found {show(item)}")
                return None
            pattern, count = item
            if count == "all":
                if layers is None or layers % len(pattern):
                    t.refuse(key, f"expected a pattern whose length divides num_layers ({layers}) with 'all', "
                             f"found {len(pattern)} kinds")  # fmt: skip
                    return None
                kinds = pattern * (layers // len(pattern))
                break
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                t.refuse(key, f"expected a count (a whole number or 'all') in {show(item)}, found {show(count)}")
                return None
            kinds += pattern * count
    unknown = sorted({str(kind) for kind in kinds} - set(ATTENTION_KINDS))
    if unknown:
        t.refuse(key, f"expected attention kinds among {', '.join(ATTENTION_KINDS)}, found {', '.join(unknown)}")
        return None
    if layers is not None and len(kinds) != layers:
        t.refuse(key, f"expected one kind per layer (num_layers: {layers}), found {len(kinds)} after expansion")
        return None
    return kinds


def _mlp(a: Arguments, t: Translation) -> None:
    """The activation and NeoX's MLP width rule (megatron/model/transformer.py: ParallelMLP): the first linear is
    `intermediate_size` wide (else expansion_factor x hidden, else 4 x hidden), two thirds of that for gated
    activations, split into up and gate; its width is rounded to 2 x mlp_multiple_of, the second linear's input
    to mlp_multiple_of. Widths that do not then agree are refused (NeoX crashes on them)."""
    name = _choice(t, a, "activation", ACTIVATIONS)
    old_style = a.values.get("mlp_type")
    if old_style is not None:
        _old_mlp(a, t, name, old_style)
        return
    if name is not None:
        activation = ACTIVATIONS[name]
        if activation == "gelu" and a["bias_gelu_fusion"]:
            if a["onnx_safe"]:
                t.refuse("bias_gelu_fusion", "expected false with onnx_safe (GPT-NeoX refuses the two together), "
                         "found true")  # fmt: skip
            activation = "approx-gelu"
        t.set("model.activation", activation, "activation", "bias_gelu_fusion")
    hidden = _typed(t, a, "hidden_size", int, "a whole number")
    size = _typed(t, a, "intermediate_size", int, "a whole number")
    factor = _typed(t, a, "expansion_factor", (int, float), "a number")
    multiple = _typed(t, a, "mlp_multiple_of", int, "a whole number")
    if size is not None and factor is not None:
        t.refuse("intermediate_size", f"expected intermediate_size or expansion_factor, found both ({size} and "
                 f"{factor})")  # fmt: skip
        return
    if hidden is None or multiple is None or multiple < 1 or name is None:
        return
    width = size or (int(factor * hidden) if factor is not None else 4 * hidden)
    first, second = width, width
    if name in GATED:
        first = int(width * 2 / 3)
        second = first // 2
    first = 2 * multiple * math.ceil(first / (2 * multiple))
    second = multiple * math.ceil(second / multiple)
    needed = 2 * second if name in GATED else second
    if first != needed:
        given = f"intermediate_size {size}" if size else f"expansion_factor {factor}" if factor else "4 x hidden_size"
        t.refuse("intermediate_size", f"{given} with mlp_multiple_of {multiple} gives the first MLP linear {first} "
                 f"outputs and the second {second} inputs; expected {'twice ' if name in GATED else ''}the second's "
                 f"(GPT-NeoX fails on these shapes: set mlp_multiple_of, or an intermediate_size that rounds "
                 f"evenly)")  # fmt: skip
        return
    t.set("model.ffn_hidden_size", second, "intermediate_size", "expansion_factor", "mlp_multiple_of")


def _old_mlp(a: Arguments, t: Translation, name: str | None, style: Any) -> None:
    """`mlp_type` of NeoX before its MLP rework: regular (4 x hidden; a gated activation 2 x hidden per branch) or
    llama (bias-free, gated by the activation, intermediate_size as is or 256 x ceil(8 hidden / 3 / 256))."""
    hidden, size = a["hidden_size"], a["intermediate_size"]
    if style not in ("regular", "llama") or not isinstance(hidden, int) or name is None:
        if style not in ("regular", "llama"):
            t.refuse("mlp_type", f"expected regular or llama, found {show(style)}")
        return
    t.notice("mlp_type", "read as GPT-NeoX read it before its MLP rework (current NeoX removed the key)")
    if style == "regular":
        t.set("model.activation", ACTIVATIONS[name], "activation", "mlp_type")
        t.set("model.ffn_hidden_size", 2 * hidden if name in GATED else 4 * hidden, "mlp_type")
        t.set("model.mlp_bias", True, "mlp_type")
        return
    gated = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "relu": "reglu"}.get(name)
    if gated is None:
        t.refuse("activation", f"expected silu, swish, gelu or relu with mlp_type: llama, found {show(name)}")
        return
    t.set("model.activation", gated, "activation", "mlp_type")
    t.set("model.ffn_hidden_size", size or 256 * math.ceil(int(8 * hidden / 3) / 256), "intermediate_size", "mlp_type")
    t.set("model.mlp_bias", False, "mlp_type")


def _moe(a: Arguments, t: Translation) -> None:
    """NeoX's dropless MoE (megatron/model/moe.py): top-k routing with softmax affinities, not renormalised, no
    load-balancing loss, ungated experts of intermediate_size (else 256 x ceil(4 hidden / 256))."""
    experts = _typed(t, a, "moe_num_experts", int, "a whole number")
    top_k, router = a["moe_top_k"], a["moe_router_type"]
    interval = a["moe_expert_interval"] if "moe_expert_interval" in a.values or "expert_interval" not in a.values \
        else a["expert_interval"]  # fmt: skip
    a["expert_interval"]
    t.set("distributed_strategy.expert_model_parallel_size", a["moe_expert_parallel_size"], "moe_expert_parallel_size")
    if experts is None or experts <= 1:
        return
    if router != "topk":
        t.refuse("moe_router_type", f"expected topk, found {show(router)}: GPT-NeoX's sinkhorn (three balancing "
                 f"iterations from column-normalised costs) is not nxd's Megatron Sinkhorn")  # fmt: skip
    if interval != 1:
        t.refuse("moe_expert_interval", f"expected 1 (MoE in every layer), found {show(interval)}: NeoX counts MoE "
                 f"layers from 0 (0, n, 2n ...), nxd from 1 (n, 2n ...)")  # fmt: skip
    if a["activation"] in GATED:
        t.refuse("activation", f"expected an ungated activation with moe_num_experts, found {a['activation']!r}: "
                 f"GPT-NeoX's experts apply it without the gate")  # fmt: skip
    hidden, size = a["hidden_size"], a["intermediate_size"]
    if isinstance(hidden, int):
        t.set("model.ffn_hidden_size", size or 256 * math.ceil(4 * hidden / 256), "intermediate_size",
              "moe_num_experts")
    t.set("model.moe", {"num_experts": experts, "top_k": top_k, "frequency": 1, "dropless": True,
                        "routing_algorithm": "top_k", "router_activation": "softmax",
                        "normalize_top_k_affinities": False},
          "moe_num_experts", "moe_top_k", "moe_router_type")  # fmt: skip


# --------------------------------------------------------------------------- parallel layout and precision


def _parallel(a: Arguments, t: Translation) -> None:
    pp = max(1, _typed(t, a, "pipe_parallel_size", int, "a whole number") or 0)
    tp = max(1, _typed(t, a, "model_parallel_size", int, "a whole number") or 0)
    t.set("distributed_strategy.pipeline_model_parallel_size", pp, "pipe_parallel_size")
    t.set("distributed_strategy.tensor_model_parallel_size", tp, "model_parallel_size")
    t.set("distributed_strategy.sequence_parallel", a["sequence_parallel"], "sequence_parallel")
    devices = a["num_gpus"]
    t.set("trainer.devices", tp * pp if devices is None else devices, "num_gpus")
    nodes = a["num_nodes"]
    t.set("trainer.num_nodes", 1 if nodes == -1 else nodes, "num_nodes")
    method, layers = a["pipe_partition_method"], a["num_layers"]
    if not isinstance(method, str) or not (method.startswith("type:") or method in ("uniform", "parameters")):
        t.refuse("pipe_partition_method", f"expected type:<regex>, uniform or parameters, found {show(method)}")
    elif pp > 1 and method != "parameters" and isinstance(layers, int) and layers >= pp:
        ends = uniform_partition(layers, pp)[1:-1]
        t.set("model.pipeline_cuts", [f"model.layers.{end - 1}" for end in ends], "pipe_partition_method")


def uniform_partition(items: int, parts: int) -> list[int]:
    """DeepSpeed's partition_uniform: part boundaries of `items` in `parts`, the first parts one larger."""
    size, extra = divmod(items, parts)
    bounds = [0]
    for index in range(parts):
        bounds.append(bounds[-1] + size + (1 if index < extra else 0))
    return bounds


def _precision(a: Arguments, t: Translation) -> None:
    """NeoX's precision (arguments.py: calculate_derived): the precision key, or an enabled fp16 / bf16 block."""
    precision, fp16, bf16 = a["precision"], a["fp16"], a["bf16"]
    fp16_on = isinstance(fp16, dict) and bool(fp16.get("enabled", False))
    bf16_on = isinstance(bf16, dict) and bool(bf16.get("enabled", False))
    for key, block in (("fp16", fp16), ("bf16", bf16)):
        if block is not None and not isinstance(block, dict):
            t.refuse(key, f"expected a block such as {{enabled: true}}, found {show(block)}")
    if fp16_on and bf16_on:
        t.refuse("bf16", "expected one of the fp16 and bf16 blocks enabled, found both (GPT-NeoX refuses that too)")
        return
    kind = precision
    if fp16_on:
        kind = "fp16" if precision in (None, "fp16") else "conflict"
    elif bf16_on:
        kind = "bfloat16" if precision in (None, "bfloat16") else "conflict"
    if kind == "conflict":
        t.refuse("precision", f"expected the precision the enabled {'fp16' if fp16_on else 'bf16'} block says, found "
                 f"{show(precision)}")  # fmt: skip
        return
    if kind == "fp16" and fp16_on and fp16.get("type") == "bfloat16":
        t.notice("fp16", "the block holds type: bfloat16, which GPT-NeoX's DeeperSpeed reads as bf16 training; read "
                 "as bf16 (mixed_precision)")  # fmt: skip
        kind = "bfloat16"
    if kind == "fp16":
        t.refuse("fp16" if fp16_on else "precision", "fp16 training with loss scaling is not in nxd yet; expected "
                 "bf16 (bf16: {enabled: true}, or precision: bfloat16) or fp32 (no fp16 block)")  # fmt: skip
        return
    if kind not in (None, "fp32", "bfloat16"):
        t.refuse("precision", f"expected fp16, fp32 or bfloat16, found {show(precision)}")
        return
    a["fp32_allreduce"]  # every type below reduces gradients in fp32
    accumulate = (a["data_types"] or {}).get("grad_accum_dtype") if isinstance(a["data_types"], dict) else None
    if accumulate not in (None, "fp32", "float32"):
        t.refuse("data_types", f"expected grad_accum_dtype fp32 (nxd accumulates bf16 runs' gradients in fp32), "
                 f"found {show(accumulate)}")  # fmt: skip
    t.set("precision.type", "mixed_precision" if kind == "bfloat16" else "fp32", "precision", "fp16", "bf16")


# --------------------------------------------------------------------------- update step and loop


def _optimizer(a: Arguments, t: Translation) -> None:
    """The optimizer block (NeoX's training.py: get_optimizer) and NeoX's AnnealingLR schedule."""
    block = a["optimizer"]
    t.claim("model.optim", "optimizer")
    if block is None:
        t.refuse("optimizer", "expected an optimizer block such as {type: Adam, params: {lr: 0.0006}}, found none "
                 "(GPT-NeoX stops without one too)")  # fmt: skip
        return
    if not (isinstance(block, dict) and isinstance(block.get("type"), str) and isinstance(block.get("params"), dict)):
        t.refuse("optimizer", f"expected a block with a type (a string) and params (a mapping), found {show(block)}")
        return
    kind, params = block["type"].lower(), dict(block["params"])
    if "weight_decay" in params:
        t.refuse("optimizer.params.weight_decay", "GPT-NeoX takes weight decay from the top-level weight_decay key "
                 "(both set fails in NeoX); move it there")  # fmt: skip
        params.pop("weight_decay")
    lr = params.get("lr", 0.001)
    if kind in ("adam", "adamw", "cpu_adam", "cpu_torch_adam"):
        if kind.startswith("cpu"):
            t.notice("optimizer.type", f"{block['type']} is DeepSpeed's CPU Adam: the same update, by torch's AdamW")
        options = {"name": "adamw" if params.pop("adam_w_mode", True) else "adam"}
        allowed = ADAM_PARAMS
        if params.pop("bias_correction", True) is not True:
            t.refuse("optimizer.params.bias_correction", "expected true (torch's Adam always corrects the bias)")
    elif kind == "sgd":
        options, allowed = {"name": "sgd"}, SGD_PARAMS
    else:
        t.refuse("optimizer.type", f"expected Adam, AdamW, cpu_adam or sgd, found {show(block['type'])}: lion, "
                 f"madgrad_wd, sm3 and onebitadam are not in nxd")  # fmt: skip
        return
    for key, value in params.items():
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            t.refuse(f"optimizer.params.{key}", f"unknown parameter of {block['type']}; expected one of "
                     f"{', '.join(sorted(allowed))}{hint}")  # fmt: skip
        elif key != "adam_w_mode":
            options[key] = value
    options["lr"] = lr
    options["weight_decay"] = a["weight_decay"]
    options["sched"] = _schedule(a, t, lr)
    for key, value in options.items():
        source = {"weight_decay": "weight_decay", "sched": "lr_decay_style", "name": "optimizer.type"}
        t.set(f"model.optim.{key}", value, source.get(key, f"optimizer.params.{key}"))


def _schedule(a: Arguments, t: Translation, lr: Any) -> dict[str, Any]:
    """NeoX's AnnealingLR over `lr_decay_iters` (else lr_decay_fraction x train_iters, else train_iters)."""
    style = _choice(t, a, "lr_decay_style", ("constant", "linear", "cosine", "exponential"))
    schedule = {"name": "NeoXAnnealing", "decay_style": style or "linear", "warmup_ratio": a["warmup"],
                "min_lr": a["min_lr"]}  # fmt: skip
    iters, fraction = a["lr_decay_iters"], a["lr_decay_fraction"]
    if iters is not None:
        schedule["max_steps"] = iters
    elif fraction is not None:
        train = a["train_iters"]
        if not isinstance(train, int) or not isinstance(fraction, int | float):
            t.refuse("lr_decay_fraction", "expected train_iters (a whole number) with it; nxd cannot take a fraction "
                     "of an epoch count before the data is read: give lr_decay_iters instead")  # fmt: skip
        else:
            schedule["max_steps"] = max(1, math.floor(train * fraction))
    if isinstance(lr, int | float) and isinstance(a["min_lr"], int | float) and a["min_lr"] > lr:
        t.refuse("min_lr", f"expected at most the learning rate ({lr}), found {a['min_lr']}")
    a["override_lr_scheduler"]
    return schedule


def _loop(a: Arguments, t: Translation) -> None:
    """Loop length, batch arithmetic (DeepSpeed's rule), validation, clipping, recompute, seed."""
    iters, epochs = a["train_iters"], a["train_epochs"]
    if iters is not None and epochs is not None:
        t.refuse("train_epochs", "expected train_iters or train_epochs, found both (GPT-NeoX refuses that too)")
    elif iters is None and epochs is None:
        t.refuse("train_iters", "expected train_iters or train_epochs, found neither")
    t.set("trainer.max_steps", -1 if iters is None else iters, "train_iters")
    t.set("trainer.max_epochs", -1 if epochs is None else epochs, "train_epochs")
    _batches(a, t)
    interval, count = a["eval_interval"], a["eval_iters"]
    t.set("trainer.val_check_interval", interval, "eval_interval")
    t.set("trainer.check_val_every_n_epoch", None, "eval_interval")
    t.set("trainer.limit_val_batches", count, "eval_iters")
    t.set("trainer.limit_test_batches", count, "eval_iters")
    t.set("trainer.num_sanity_val_steps", 0)
    t.set("trainer.log_every_n_steps", a["log_interval"], "log_interval")
    clip = a["gradient_clipping"]
    t.set("trainer.gradient_clip_val", clip if clip else None, "gradient_clipping")
    t.set("seed", a["seed"], "seed")
    if a["checkpoint_activations"]:
        t.set("model.activations_checkpoint_granularity", "full", "checkpoint_activations")
        if a["checkpoint_num_layers"] != 1:
            t.notice("checkpoint_num_layers", f"{a['checkpoint_num_layers']} layers per checkpoint: nxd recomputes "
                     f"layer by layer, which computes the same and keeps a little more memory")  # fmt: skip
    else:
        a["checkpoint_num_layers"]
    zero = a["zero_optimization"]
    stage = 0
    if zero is not None:
        if not isinstance(zero, dict) or not isinstance(zero.get("stage", 0), int):
            t.refuse("zero_optimization", f"expected a block with a stage (0 to 3), found {show(zero)}")
            return
        stage = zero.get("stage", 0)
        if stage not in (0, 1):
            t.refuse("zero_optimization.stage", f"expected 0 or 1, found {stage}: ZeRO stages 2 and 3 are not in nxd "
                     f"yet (stage 1 shards the optimizer state, as nxd's zero1)")  # fmt: skip
        for key in ("cpu_offload", "offload_optimizer", "offload_param", "cpu_offload_params"):
            if zero.get(key) not in (None, False, {}) and not (isinstance(zero.get(key), dict)
                                                               and zero[key].get("device") in (None, "none")):
                t.refuse(f"zero_optimization.{key}", f"expected false: offloading to the CPU is not in nxd yet, found "
                         f"{show(zero[key])}")  # fmt: skip
        offload = {"cpu_offload", "offload_optimizer", "offload_param", "cpu_offload_params"}
        tuning = sorted(set(zero) - offload - {"stage"})
        if tuning:
            t.notice("zero_optimization", f"accepted, changes nothing here: {', '.join(tuning)} tune DeepSpeed's "
                     f"communication buckets and overlap; nxd's FSDP2 sizes its own")  # fmt: skip
    t.set("distributed_strategy.zero1", stage == 1, "zero_optimization")


def _batches(a: Arguments, t: Translation) -> None:
    """train_batch_size = micro batch x gradient accumulation x data-parallel size: any two give the third
    and all three must agree (DeepSpeed's rule; NeoX's gradient_accumulation_steps defaults to 1)."""
    total = _typed(t, a, "train_batch_size", int, "a whole number")
    micro = _typed(t, a, "train_micro_batch_size_per_gpu", int, "a whole number")
    steps = _typed(t, a, "gradient_accumulation_steps", int, "a whole number")
    steps = steps if "gradient_accumulation_steps" in a.values else None  # NeoX's default 1 is no choice
    sizes = [a[key] for key in ("num_gpus", "num_nodes", "model_parallel_size", "pipe_parallel_size")]
    if not all(isinstance(size, int) or size is None for size in sizes):
        return
    devices, nodes, tp, pp = sizes
    model_parallel = max(1, tp or 0) * max(1, pp or 0)
    world = (devices or model_parallel) * (1 if nodes in (None, -1) else nodes)
    dp = world // model_parallel or 1
    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    if total is None and micro is None:
        t.refuse("train_batch_size", "expected train_batch_size or train_micro_batch_size_per_gpu, found neither")
        return
    if micro is None:
        micro, remainder = divmod(total, dp * (steps or 1))
        if remainder or micro == 0:
            t.refuse("train_batch_size", f"expected a multiple of gradient_accumulation_steps x data-parallel size "
                     f"({steps or 1} x {dp}), found {total}")  # fmt: skip
            return
    elif total is None:
        total = micro * (steps or 1) * dp
    elif steps is not None and total != micro * steps * dp:
        t.refuse("train_batch_size", f"expected train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
                 f"data-parallel size ({micro} x {steps} x {dp} = {micro * steps * dp}), found {total}")  # fmt: skip
        return
    t.set("data.micro_batch_size", micro, *keys)
    t.set("data.global_batch_size", total, *keys)


# --------------------------------------------------------------------------- data and tokenizer


def _data(a: Arguments, t: Translation) -> None:
    path, split = a["data_path"], a["split"]
    paths = {name: a[f"{name}_data_paths"] for name in ("train", "valid", "test")}
    weights = {name: a[f"{name}_data_weights"] for name in ("train", "valid", "test")}
    given = [name for name, value in paths.items() if value is not None]
    if path is not None and given:
        t.refuse("data_path", f"expected data_path or train/valid/test_data_paths, found both (data_path and "
                 f"{', '.join(f'{name}_data_paths' for name in given)})")  # fmt: skip
    elif path is not None:
        t.set("data.data_prefix", path, "data_path")
        t.set("data.splits_string", str(split), "split")
    elif given:
        if len(given) != 3:
            missing = sorted(set(paths) - set(given))
            t.refuse(f"{missing[0]}_data_paths", f"expected train, valid and test data paths together (as GPT-NeoX "
                     f"does), found only {', '.join(given)}")  # fmt: skip
        else:
            blends = {}
            for name, section in (("train", "train"), ("valid", "validation"), ("test", "test")):
                blend = _blend(t, name, paths[name], weights[name])
                if blend is not None:
                    blends[section] = blend
            t.set("data.data_prefix", blends, *(f"{name}_data_paths" for name in paths))
    impl = _choice(t, a, "data_impl", ("infer", "mmap", "cached"))
    if impl == "cached":
        t.refuse("data_impl", "expected mmap (or infer): the older cached format is not read by nxd; preprocess the "
                 "data again")  # fmt: skip
    t.set("data.data_impl", "mmap", "data_impl")
    for key, allowed, why in (("pack_impl", "packed", "unpacked and pack_until_overflow samples are not in nxd yet"),
                              ("dataset_impl", "gpt2", "pairwise and online datasets are not in nxd yet"),
                              ("train_impl", "normal", "dpo, kto, rm and reinforce training are not in nxd yet")):
        if a[key] != allowed:
            t.refuse(key, f"expected {allowed}, found {show(a[key])}: {why}")
    t.set("data.num_workers", a["num_workers"], "num_workers")
    t.set("data.eod_mask_loss", a["eod_mask_loss"], "eod_mask_loss")
    t.set("data.skip_warmup", not a["mmap_warmup"], "mmap_warmup")
    if path is None and not given:
        t.notice("data_path", "no data_path or train/valid/test_data_paths: nxd trains on its built-in corpus "
                 "(Python's standard library, with a BPE trained on it)")  # fmt: skip


def _blend(t: Translation, name: str, paths: Any, weights: Any) -> list[Any] | None:
    key = f"{name}_data_paths"
    if not isinstance(paths, list) or not paths:
        t.refuse(key, f"expected a list of data prefixes, found {show(paths)}")
        return None
    if weights is None:
        weights = [1.0] * len(paths)
    if not isinstance(weights, list) or len(weights) != len(paths):
        t.refuse(f"{name}_data_weights", f"expected one weight per path ({len(paths)}), found {show(weights)}")
        return None
    return [value for pair in zip(weights, paths, strict=True) for value in pair]


def _tokenizer(a: Arguments, t: Translation) -> None:
    """NeoX's tokenizers (megatron/tokenizer/tokenizer.py: build_tokenizer) as nxd's data.tokenizer."""
    kind = a["tokenizer_type"]
    vocab, merges = a["vocab_file"], a["merge_file"]
    lowered = kind.lower() if isinstance(kind, str) else kind
    keys = ("tokenizer_type", "vocab_file", "merge_file")
    if lowered == "gpt2bpetokenizer":
        if vocab is None and merges is None:
            return  # no tokenizer named: the data's own (pre-tokenised) ids and the model's vocabulary decide
        t.set("data.tokenizer", {"library": "megatron", "type": "GPT2BPETokenizer", "vocab_file": vocab,
                                 "merge_file": merges}, *keys)  # fmt: skip
    elif lowered in ("hftokenizer", "hfgpt2tokenizer"):
        if vocab is None:
            t.refuse("vocab_file", f"expected a local tokenizer (a tokenizer.json, or a directory with one) for "
                     f"{kind}, found none")  # fmt: skip
            return
        t.set("data.tokenizer", {"library": "huggingface", "type": vocab}, *keys)
    elif lowered == "spmtokenizer":
        if not isinstance(vocab, str) or Path(vocab).name != "tokenizer.model":
            t.refuse("vocab_file", f"expected a SentencePiece model named tokenizer.model (nxd reads its directory), "
                     f"found {show(vocab)}")  # fmt: skip
            return
        t.set("data.tokenizer", {"library": "huggingface", "type": str(Path(vocab).parent)}, *keys)
    else:
        t.refuse("tokenizer_type", f"expected GPT2BPETokenizer, HFTokenizer, HFGPT2Tokenizer or SPMTokenizer, found "
                 f"{show(kind)}: CharLevelTokenizer and TiktokenTokenizer are not in nxd")  # fmt: skip


# --------------------------------------------------------------------------- checkpoints and logs


def _checkpoints(a: Arguments, t: Translation) -> None:
    """save / load / finetune, the save cadence (checkpoint_factor, checkpoint_scale, extra_save_iters) and
    keep_last_n_checkpoints; NeoX also saves when training ends."""
    save, load, finetune = a["save"], a["load"], a["finetune"]
    factor, scale, extra = a["checkpoint_factor"], a["checkpoint_scale"], a["extra_save_iters"]
    t.set("exp_manager.create_checkpoint_callback", save is not None, "save")
    if save is not None:
        t.set("exp_manager.explicit_log_dir", save, "save")
        if factor is None and extra is None:
            t.refuse("save", "expected checkpoint_factor or extra_save_iters with save (GPT-NeoX's rule), found "
                     "neither")  # fmt: skip
    params = "exp_manager.checkpoint_callback_params"
    steps: set[int] = set()
    if scale not in ("linear", "log"):
        t.refuse("checkpoint_scale", f"expected linear or log, found {show(scale)}")
    elif factor is not None:
        if not isinstance(factor, int | float) or isinstance(factor, bool) or factor <= 0:
            t.refuse("checkpoint_factor", f"expected a positive number, found {show(factor)}")
        elif scale == "linear":
            if factor != int(factor):
                t.refuse("checkpoint_factor", f"expected a whole number with checkpoint_scale linear, found {factor}")
            else:
                t.set(f"{params}.every_n_train_steps", int(factor), "checkpoint_factor")
        elif factor <= 1:
            t.refuse("checkpoint_factor", f"expected more than 1 with checkpoint_scale log, found {factor}")
        else:
            steps |= _powers(factor, a["train_iters"])
    if extra is not None:
        if not isinstance(extra, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in extra):
            t.refuse("extra_save_iters", f"expected a list of iterations, found {show(extra)}")
        else:
            if 0 in extra:
                t.notice("extra_save_iters", "iteration 0 (the initial weights, before any step) is not saved")
            steps |= {step for step in extra if step > 0}
    if steps:
        t.set(f"{params}.save_at_steps", sorted(steps), "checkpoint_factor", "extra_save_iters")
    keep = a["keep_last_n_checkpoints"]
    t.set(f"{params}.save_top_k", -1 if keep is None else keep, "keep_last_n_checkpoints")
    t.set(f"{params}.monitor", "step", "keep_last_n_checkpoints")
    t.set(f"{params}.mode", "max", "keep_last_n_checkpoints")
    t.set(f"{params}.save_last", save is not None, "save")
    if load is not None:
        if load == save:
            t.set("exp_manager.resume_if_exists", True, "load")
            t.set("exp_manager.resume_ignore_no_checkpoint", True, "load")
        else:
            t.set("exp_manager.resume_from_checkpoint", load, "load")
    if finetune:
        if load is None:
            t.refuse("finetune", "expected load (the weights to fine-tune) with finetune: true, found no load")
        t.set("model.weight_init_only", True, "finetune")


def _powers(factor: float, until: Any) -> set[int]:
    """NeoX's log-scaled saves: int(factor ** k) for k = 0, 1 ... up to train_iters."""
    if not isinstance(until, int):
        return set()
    steps, power = set(), 1.0
    while power <= until:
        steps.add(int(power))
        power *= factor
    return steps


def _logging(a: Arguments, t: Translation) -> None:
    save, log_dir, board = a["save"], a["log_dir"], a["tensorboard_dir"]
    if log_dir is not None:
        if save is None:
            t.set("exp_manager.explicit_log_dir", log_dir, "log_dir")
        elif log_dir != save:
            t.notice("log_dir", f"nxd keeps text logs beside the checkpoints, in the run directory {save!r} (save)")
    if board is not None:
        t.set("exp_manager.create_tensorboard_logger", True, "tensorboard_dir")
        where = save or log_dir
        if board != where:
            t.notice("tensorboard_dir", f"TensorBoard events are written in the run directory "
                     f"({where!r}) rather than {board!r}" if where else "TensorBoard events are written in the run "
                     "directory")  # fmt: skip
    t.set("exp_manager.log_parameter_norm", a["log_param_norm"], "log_param_norm")
    t.set("exp_manager.log_gradient_norm", a["log_grad_norm"], "log_grad_norm")
