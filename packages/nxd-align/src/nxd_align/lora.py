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

import fnmatch
import json
import logging
import sys
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from nxd_models import (
    InitModule,
    ModelConfigError,
    ModelFamily,
    Seeder,
    init_rule,
    initial_values,
    initialise,
    seed_or_drawn,
)
from torch import nn

from .fused_lora import PARTS, FusedQKVLora, init_adapter_half, is_fused_qkv

ADAPTER = "default"
"""peft's adapter name, which its layers put into parameter names (`lora_A.default.weight`)."""
BASE_LAYER = ".base_layer"
FUSED_NAMES = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
"""NxDT's names for fused projections -> the linear layers they mean."""
ADAPTER_STYLES = {
    "colwise": ("lora_a_colwise", "lora_b_colwise"),
    "colwise_kv": ("lora_a_colwise", "lora_b_colwise_kv"),
    "rowwise": ("lora_a_rowwise", "lora_b_rowwise"),
}
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
    """Whether a state-dict key is a LoRA adapter's (peft's `lora_A` / `lora_B` names)."""
    return ".lora_A." in key or ".lora_B." in key


IMPORT_NOTICES = ("bitsandbytes.backends.cpu.ops", "torch.utils._pytree")
"""Loggers that speak while peft imports, of nothing a user acts on: bitsandbytes (where installed) about 4-bit CPU
matmul kernels, not used here, and torch's pytree about the enums of torchao, which transformers imports."""


def _peft() -> Any:
    """peft, imported when a run has adapters, with `IMPORT_NOTICES` kept quiet while it loads."""
    loggers = [logging.getLogger(name) for name in IMPORT_NOTICES]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        import peft
    except ImportError:
        raise LoraConfigError(
            f"{KEY}: LoRA adapters are peft's, and peft is not installed; install nxd-align[lora] "
            "(pip install 'nxd-align[lora]')"
        ) from None
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
    return peft


@contextmanager
def adapters_disabled(modules: Iterable[nn.Module]) -> Iterator[None]:
    """Inside, the adapted `modules` (a model, or a rank's pipeline stages) compute the base model: every
    adapter layer switched off with peft's `enable_adapters(False)` and back on after, so a reference
    pass (DPO) needs no second copy of the model. Only for passes without backward: peft's switch also
    clears and restores the adapters' requires_grad."""
    tuners = sys.modules.get("peft.tuners.tuners_utils")  # no peft layer exists before LoRA imports peft
    kinds = (FusedQKVLora,) if tuners is None else (FusedQKVLora, tuners.BaseTunerLayer)
    layers = [m for module in modules for m in module.modules() if isinstance(m, kinds)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


@dataclass(frozen=True)
class AdaptedWeight:
    """One adapted weight: its adapter's A and B and the base weight, under the adapted model's names,
    and the base weight under the wrapped family's name."""

    module: str
    a: str
    b: str
    live: str
    weight: str


class LoraFamily:
    """`family` with LoRA adapters on `spec.targets` (see the module docstring); raises LoraConfigError
    for targets that name no linear layer of the model."""

    def __init__(self, family: ModelFamily, spec: LoraSpec):
        self.base, self.spec = family, spec
        self.linear, self.fused = adapted_modules(family, spec.targets)
        self.peft_config = _peft().LoraConfig(
            r=spec.rank,
            lora_alpha=spec.alpha,
            lora_dropout=spec.dropout,
            bias=spec.bias,
            target_modules=list(self.linear) or None,
        )

    def __getattr__(self, name: str) -> Any:
        """The wrapped family's protocol (never a dunder, so copying and pickling see this class)."""
        if name.startswith("__") or name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    @property
    def modules(self) -> tuple[str, ...]:
        """The adapted modules, in model order."""
        return tuple(dict.fromkeys(w.module for w in self.weights))

    @cached_property
    def weights(self) -> list[AdaptedWeight]:
        """Every adapted weight, in model order (fixed by the targets, so found once)."""
        found = [
            AdaptedWeight(
                name,
                *(f"{name}.lora_{half}.{ADAPTER}.weight" for half in "AB"),
                f"{name}{BASE_LAYER}.weight",
                f"{name}.weight",
            )
            for name in self.linear
        ]
        found += [
            AdaptedWeight(
                name,
                f"{name}.lora_A.{part}.weight",
                f"{name}.lora_B.{part}.weight",
                f"{name}{BASE_LAYER}.weight_{part}",
                f"{name}.weight_{part}",
            )
            for name, parts in self.fused.items()
            for part in parts
        ]
        order = {name: index for index, name in enumerate(self.base.parameter_shapes())}
        return sorted(found, key=lambda w: order[w.weight])

    def adapt(self, model: nn.Module) -> nn.Module:
        """`model` (a build of the wrapped family) with adapters; only they (and `bias`) train."""
        if self.linear:
            model = _peft().inject_adapter_in_model(self.peft_config, model, adapter_name=ADAPTER)
        model.requires_grad_(False)
        for name, parts in self.fused.items():
            parent, _, leaf = name.rpartition(".")
            s = self.spec
            fused = FusedQKVLora(model.get_submodule(name), parts, s.rank, s.alpha, s.dropout)
            model.get_submodule(parent).register_module(leaf, fused)
        adapted_biases = {w.live.replace(".weight", ".bias") for w in self.weights}
        for name, parameter in model.named_parameters():  # lora_bias as peft's `bias` option means it
            bias = {"all": "bias" in name.rpartition(".")[2], "lora_only": name in adapted_biases}.get(self.spec.bias)
            parameter.requires_grad_(is_adapter_key(name) or bool(bias))
        return model

    def build_on_meta(self) -> nn.Module:
        return self.adapt(self.base.build_on_meta())

    def build(
        self, device: torch.device | str = "cpu", *, seed: int | None = None, use_cpu_initialization: bool = True
    ) -> nn.Module:
        """The wrapped family's model, with the values it builds from `seed`, and adapters: A drawn
        (peft's Kaiming init), B zero, so the adapted model starts as the base model."""
        seed = seed_or_drawn(seed)  # before the meta build, whatever it draws
        meta = self.build_on_meta()
        return initialise(
            meta,
            seed=seed,
            device=torch.device(device),
            use_cpu_initialization=use_cpu_initialization,
            rule=self._init_rule(meta),
        )

    def initial_values(
        self, *, seed: int, device: torch.device, names: Collection[str] | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """As the wrapped family's, with the adapters' initial values (what `build(seed=seed)` holds)."""
        meta = self.build_on_meta()
        return initial_values(meta, self._init_rule(meta), seed=seed, device=device, names=names)

    @staticmethod
    def _init_rule(model: nn.Module) -> InitModule:
        """Adapter halves by peft's rule; a base layer under the name, and so with the values, it has in
        the wrapped family's model."""
        base = init_rule(model)

        def rule(name: str, module: nn.Module, seeded: Seeder) -> None:
            half = name.rpartition(".")[0].rpartition(".")[2]
            if half in ("lora_A", "lora_B"):
                init_adapter_half(module.weight, half)
                return
            base_name = name.replace(BASE_LAYER, "")
            with seeded(base_name):
                base(base_name, module, seeded)

        return rule

    def tp_plan(self) -> dict[str, str]:
        plan: dict[str, str] = {}
        leaves = {name.rpartition(".")[2] for name in self.modules}
        for pattern, style in self.base.tp_plan().items():
            if pattern.rpartition(".")[2] not in leaves:
                plan[pattern] = style
            elif style == "qkv":
                plan |= {
                    pattern + BASE_LAYER: style,
                    f"{pattern}.lora_A.*": "lora_a_colwise",
                    f"{pattern}.lora_B.q": "lora_b_colwise",
                    f"{pattern}.lora_B.k": "lora_b_colwise_kv",
                    f"{pattern}.lora_B.v": "lora_b_colwise_kv",
                }
            elif style in ADAPTER_STYLES:
                a, b = ADAPTER_STYLES[style]
                plan |= {pattern + BASE_LAYER: style, f"{pattern}.lora_A.*": a, f"{pattern}.lora_B.*": b}
            else:
                raise LoraConfigError(
                    f"{KEY}.target_modules: {pattern} shards as {style!r}; LoRA follows "
                    f"{', '.join(ADAPTER_STYLES)} and qkv layers only"
                )
        names = {name for name, _ in self.build_on_meta().named_modules()}  # only the parts that have adapters
        return {pattern: style for pattern, style in plan.items() if fnmatch.filter(names, pattern)}

    def trainable_count(self) -> int:
        """Adapter parameters: r x (in + out) per adapted weight (biases under `bias` not included)."""
        shapes = self.base.parameter_shapes()
        return sum(self.spec.rank * (shapes[w.weight][0] + shapes[w.weight][1]) for w in self.weights)

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
            from torch.distributed.tensor import DTensor

            for w in self.weights:
                if w.live not in state:  # another pipeline stage's layer
                    continue
                delta = self.spec.scaling * (state[w.b].float() @ state[w.a].float())
                if isinstance(delta, DTensor) and not isinstance(state[w.live], DTensor):
                    delta = delta.full_tensor()
                frozen[w.weight] = state[w.live].float() + delta
        return weights | frozen

    def adapter_export(self) -> dict[str, Any]:
        """What nxd-ckpt needs to write the adapters as a peft adapter folder (adapter_config.json and
        the key table for the Hugging Face model) and to merge them into the base weights, as plain data."""
        hf_keys = self.base.hf_mapping().keys
        keys, merges, leaves = {}, [], set()
        for w in self.weights:
            hf_module = hf_keys.get(w.weight, w.weight).removesuffix(".weight")
            keys |= {
                w.a: f"base_model.model.{hf_module}.lora_A.weight",
                w.b: f"base_model.model.{hf_module}.lora_B.weight",
            }
            merges.append([w.weight, w.a, w.b])
            leaves.add(hf_module.rpartition(".")[2])
        config = json.loads(json.dumps(self.peft_config.to_dict(), default=sorted))  # sets as lists
        config |= {"target_modules": sorted(leaves), "task_type": "CAUSAL_LM", "base_model_name_or_path": None}
        return {"config": config, "keys": keys, "merges": merges, "scaling": self.spec.scaling}


Fused = dict[str, tuple[str, ...]]
"""A fused QKV module's name -> the projections (q, k, v) that get adapters."""


def adapted_modules(family: ModelFamily, targets: Iterable[str]) -> tuple[tuple[str, ...], Fused]:
    """The full names of the linear layers `targets` select, and the fused QKV modules with the
    projections (q, k, v) selected, in model order; LoraConfigError for a name no decoder layer has,
    or one that is not a linear layer."""
    model = family.build_on_meta()
    layers = {id(layer) for layer in family.decoder_layers(model)}
    inside: dict[str, nn.Module] = {}
    for prefix, layer in model.named_modules():
        if id(layer) in layers:
            inside |= {f"{prefix}.{name}": module for name, module in layer.named_modules() if name}
    leaf = {name: name.rpartition(".")[2] for name in inside}
    linear = {leaf[name] for name, module in inside.items() if isinstance(module, nn.Linear)}
    fused_modules = [name for name, module in inside.items() if is_fused_qkv(module)]
    fused_leaves = {leaf[name] for name in fused_modules}
    parts = {f"{part}_proj" for part in PARTS} if fused_leaves else set()  # a transformers model keeps stand-ins
    other = set(leaf.values()) - linear - fused_leaves - parts
    names = {name: parts for name, parts in FUSED_NAMES.items() if name not in other and set(parts) <= linear}
    if fused_leaves:  # the fused module's own name, and each projection's
        names |= {name: (name,) for name in fused_leaves} | {f"{part}_proj": (f"{part}_proj",) for part in PARTS}
    valid = ", ".join(sorted(linear | set(names)))
    wanted: set[str] = set()
    problems = []
    for target in targets:
        if target in other:
            problems.append(
                f"{KEY}.target_modules: {target!r} is a {type(_first(inside, target)).__name__}, not a "
                f"linear layer; LoRA adapts linear layers: {valid}"
            )
        elif target not in linear and target not in names:
            problems.append(
                f"{KEY}.target_modules: {target!r} names no linear layer of this model; expected some of {valid}"
            )
        else:
            wanted |= set(names.get(target, (target,)))
    if not list(targets):
        problems.append(f"{KEY}.target_modules: expected at least one module, found an empty list")
    if problems:
        raise LoraConfigError(*problems)
    fused = {}
    for name in fused_modules:
        parts = PARTS if leaf[name] in wanted else tuple(p for p in PARTS if f"{p}_proj" in wanted)
        if parts:
            fused[name] = parts
    return tuple(name for name in inside if leaf[name] in wanted and leaf[name] in linear), fused


def _first(modules: dict[str, nn.Module], leaf: str) -> nn.Module:
    return next(module for name, module in modules.items() if name.rpartition(".")[2] == leaf)
