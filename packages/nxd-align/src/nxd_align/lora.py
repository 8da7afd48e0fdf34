"""LoRA adapters (peft's LoRA layers, LoraConfig and naming) on any nxd-models family.

`LoraFamily` wraps a model family so that everything which builds a model (one process, or
nxd-parallel's meta-device build, sharding and materialisation) gets the adapted model: peft wraps
each target linear layer (`q_proj` becomes a LoRA layer holding `q_proj.base_layer`, `lora_A.default`
and `lora_B.default`), the base is frozen and only the adapters (and the biases `lora_bias` selects)
train. Its tensor-parallel plan gives each adapter half the style that follows its base layer's
sharding. The rest of the family protocol (decoder layers, pipeline stages, Hugging Face mapping of
the base weights) is the wrapped family's.

Target names are the model's linear layers inside its decoder layers, in transformers' spelling
(`q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`, `down_proj`), or NxDT's fused
names, each meaning its parts: `qkv_proj` (q, k and v) and `gate_up_proj` (gate and up).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from nxd_models import ModelConfigError, ModelFamily
from peft import LoraConfig, inject_adapter_in_model
from torch import nn
from torch.distributed.tensor import DTensor

ADAPTER = "default"
"""peft's adapter name, which its layers put into parameter names (`lora_A.default.weight`)."""
BASE_LAYER = ".base_layer"
FUSED_NAMES = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
"""NxDT's names for fused projections -> the linear layers they mean."""
ADAPTER_STYLES = {"colwise": ("lora_a_colwise", "lora_b_colwise"),
                  "colwise_kv": ("lora_a_colwise", "lora_b_colwise_kv"),
                  "rowwise": ("lora_a_rowwise", "lora_b_rowwise")}  # fmt: skip
"""A base layer's tensor-parallel style -> the styles of its adapter's A and B (nxd-parallel's names)."""
KEY = "model_alignment_strategy.peft"


class LoraConfigError(ModelConfigError):
    """LoRA settings that do not fit the model."""


@dataclass(frozen=True)
class LoraSpec:
    """`model_alignment_strategy.peft`, as plain values."""

    rank: int = 16
    alpha: float = 32
    dropout: float = 0.0
    bias: str = "none"
    """Biases that train with the adapters: none, all, or lora_only (those of adapted layers)."""
    targets: tuple[str, ...] = ("qkv_proj",)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def base_key(key: str) -> str:
    """The wrapped family's name for a key of the adapted model (`q_proj.base_layer.weight` -> `q_proj.weight`)."""
    return key.replace(BASE_LAYER + ".", ".")


def is_adapter_key(key: str) -> bool:
    return ".lora_A." in key or ".lora_B." in key


def peft_key(key: str, hf_key: str | None = None) -> str:
    """peft's saved name of adapter parameter `key` (`...q_proj.lora_A.default.weight` ->
    `base_model.model....q_proj.lora_A.weight`); `hf_key` is the Hugging Face name of its base weight
    where the family names it differently."""
    module, _, rest = key.partition(".lora_")
    half = rest.split(".", 1)[0]  # A or B
    if hf_key is not None:
        module = hf_key.removesuffix(".weight")
    return f"base_model.model.{module}.lora_{half}.weight"


class LoraFamily:
    """`family` with LoRA adapters on `spec.targets` (see the module docstring); raises LoraConfigError
    for targets that name no linear layer of the model."""

    def __init__(self, family: ModelFamily, spec: LoraSpec):
        self.base, self.spec = family, spec
        self.modules = adapted_modules(family, spec.targets)
        self.peft_config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout, bias=spec.bias,
                                      target_modules=list(self.modules))  # fmt: skip

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def adapt(self, model: nn.Module) -> nn.Module:
        """`model` (a build of the wrapped family) with adapters; only they (and `bias`) train."""
        return inject_adapter_in_model(self.peft_config, model, adapter_name=ADAPTER)

    def build_on_meta(self) -> nn.Module:
        return self.adapt(self.base.build_on_meta())

    def build(self, device: torch.device, *, use_cpu_initialization: bool = True) -> nn.Module:
        """The wrapped family's model with adapters: A drawn (peft's Kaiming init) after the base's
        initialisation, B zero, so the adapted model starts as the base model."""
        return self.adapt(self.base.build(device, use_cpu_initialization=use_cpu_initialization))

    def tp_plan(self) -> dict[str, str]:
        plan: dict[str, str] = {}
        leaves = {name.rpartition(".")[2] for name in self.modules}
        for pattern, style in self.base.tp_plan().items():
            if pattern.rpartition(".")[2] not in leaves:
                plan[pattern] = style
                continue
            if style not in ADAPTER_STYLES:
                raise LoraConfigError(f"{KEY}.target_modules: {pattern} shards as {style!r}; LoRA follows "
                                      f"{', '.join(ADAPTER_STYLES)} layers only")  # fmt: skip
            a, b = ADAPTER_STYLES[style]
            plan |= {pattern + BASE_LAYER: style, f"{pattern}.lora_A.*": a, f"{pattern}.lora_B.*": b}
        return plan

    def trainable_count(self) -> int:
        """Adapter parameters: r x (in + out) per adapted layer (biases under `bias` not included)."""
        shapes = self.base.parameter_shapes()
        return sum(self.spec.rank * (shape[0] + shape[1]) for shape in (shapes[f"{name}.weight"]
                                                                         for name in self.modules))  # fmt: skip

    def adapter_keys(self) -> list[str]:
        """The adapted model's names of the adapter weights."""
        return [f"{name}.lora_{half}.{ADAPTER}.weight" for name in self.modules for half in "AB"]

    def base_weights(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """`model`'s live tensors of the base model (adapters left out), under the wrapped family's names:
        what initial weights (a Hugging Face directory, a full nxd checkpoint) load into."""
        return {base_key(key): value for key, value in model.state_dict().items() if not is_adapter_key(key)}

    def checkpoint_weights(self, model: nn.Module, *, base: str | None = None) -> dict[str, torch.Tensor]:
        """The weights a checkpoint of the adapted `model` holds: the trained parameters under their own
        names; with `base` "frozen" also every base weight under the wrapped family's names; with
        "merged" the same, each adapted weight merged as W + (alpha / r) B A, computed in fp32 on copies
        (the live weights never change)."""
        state = model.state_dict()
        trained = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
        weights = {key: value for key, value in state.items() if key in trained}
        if base is None:
            return weights
        frozen = self.base_weights(model)
        if base == "merged":
            for name in self.modules:
                if (live := f"{name}{BASE_LAYER}.weight") not in state:  # another pipeline stage's layer
                    continue
                a, b = (state[f"{name}.lora_{half}.{ADAPTER}.weight"].float() for half in "AB")
                delta = self.spec.scaling * (b @ a)
                if isinstance(delta, DTensor) and not isinstance(state[live], DTensor):
                    delta = delta.full_tensor()
                frozen[f"{name}.weight"] = state[live].float() + delta
        return weights | frozen

    def adapter_export(self) -> dict[str, Any]:
        """What nxd-ckpt needs to write the adapters as a peft adapter folder (adapter_config.json and
        the key table) and to merge them into the base weights, as plain data."""
        hf_keys = self.base.hf_mapping().keys
        keys, merges = {}, []
        for name in self.modules:
            weight = f"{name}.weight"
            a, b = (f"{name}.lora_{half}.{ADAPTER}.weight" for half in "AB")
            keys |= {a: peft_key(a, hf_keys.get(weight)), b: peft_key(b, hf_keys.get(weight))}
            merges.append([weight, a, b])
        config = json.loads(json.dumps(self.peft_config.to_dict(), default=sorted))  # sets as lists
        leaves = sorted({hf_keys.get(f"{name}.weight", name).removesuffix(".weight").rpartition(".")[2]
                         for name in self.modules})  # fmt: skip
        config |= {"target_modules": leaves, "task_type": "CAUSAL_LM", "base_model_name_or_path": None}
        return {"config": config, "keys": keys, "merges": merges, "scaling": self.spec.scaling}


def adapted_modules(family: ModelFamily, targets: Iterable[str]) -> tuple[str, ...]:
    """The full names of the linear layers `targets` select, in model order; LoraConfigError for a
    name no decoder layer has, or one that is not a linear layer."""
    model = family.build_on_meta()
    layers = {id(layer) for layer in family.decoder_layers(model)}
    inside: dict[str, nn.Module] = {}
    for prefix, layer in model.named_modules():
        if id(layer) in layers:
            inside |= {f"{prefix}.{name}": module for name, module in layer.named_modules() if name}
    linear = {name.rpartition(".")[2] for name, module in inside.items() if isinstance(module, nn.Linear)}
    other = {name.rpartition(".")[2] for name, module in inside.items()} - linear
    fused = {name: parts for name, parts in FUSED_NAMES.items() if name not in other and set(parts) <= linear}
    wanted: list[str] = []
    problems = []
    for target in targets:
        if target in other:
            problems.append(f"{KEY}.target_modules: {target!r} is a {type(_first(inside, target)).__name__}, not a "
                            f"linear layer; LoRA adapts linear layers: {', '.join(sorted(linear | set(fused)))}")
        elif target not in linear and target not in fused:
            problems.append(f"{KEY}.target_modules: {target!r} names no linear layer of this model; expected "
                            f"some of {', '.join(sorted(linear | set(fused)))}")  # fmt: skip
        else:
            wanted += fused.get(target, (target,))
    if not list(targets):
        problems.append(f"{KEY}.target_modules: expected at least one module, found an empty list")
    if problems:
        raise LoraConfigError(*problems)
    return tuple(name for name in inside if name.rpartition(".")[2] in wanted)


def _first(modules: dict[str, nn.Module], leaf: str) -> nn.Module:
    return next(module for name, module in modules.items() if name.rpartition(".")[2] == leaf)
