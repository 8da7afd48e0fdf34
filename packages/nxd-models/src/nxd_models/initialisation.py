"""Seeded initialisation one module at a time, so that no process ever holds a whole model.

The parameters and buffers a module owns draw from the torch RNG seeded by the run's seed and the
module's name. A value therefore depends on the seed and the name alone, never on which other
modules a process initialises or in what order: a process that keeps only its shards initialises
the modules it holds one at a time, slices each and lets it go (nxd-parallel's `materialise`), and
its slices equal a one-process build's values. Host memory is bounded by one module's tensors.

A family's rule (`InitModule`) initialises one module's own tensors, as its whole-model
initialisation would, and may reseed for parts that stand for separate modules elsewhere (a QKV
module's query, key and value take the seeds of q_proj, k_proj and v_proj, so fusing changes no value).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import torch
from torch import nn

from .gpt import GPTForCausalLM
from .hf_moe import init_experts
from .hf_types import is_hf_model
from .moe import Experts
from .qkv import QKVLinear, qkv_part_unit

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Seeder = Callable[[str], AbstractContextManager[None]]
"""`seeded(name)`: the torch RNG seeded for the unit called `name` while the context is open."""
InitModule = Callable[[str, nn.Module, Seeder], None]
"""`rule(name, module, seeded)`: initialise `module`'s own parameters and buffers (already allocated,
the RNG already seeded for `name`)."""


def unit_seed(seed: int, name: str) -> int:
    """The seed of one named unit: stable across processes, machines and Python runs."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def seed_or_drawn(seed: int | None) -> int:
    """`seed`, or (None) a seed drawn from the torch RNG: a build after `torch.manual_seed(n)` repeats."""
    return int(torch.randint(0, 2**62, ()).item()) if seed is None else seed


def init_rule(model: nn.Module) -> InitModule:
    """The initialisation rule of either family's model tree (meta or not)."""
    if isinstance(model, GPTForCausalLM):
        return model.init_module
    if is_hf_model(model):
        return lambda name, module, seeded: _hf_init_module(model, name, module, seeded)
    raise TypeError(f"no initialisation rule for {type(model).__name__}")


def _hf_init_module(model: PreTrainedModel, name: str, module: nn.Module, seeded: Seeder) -> None:
    """transformers' own `_init_weights`; a QKV module's parts as the q/k/v Linear layers they replace,
    and nxd's stacked experts as transformers' Mixtral experts."""
    if isinstance(module, Experts):
        init_experts(module, model.config.initializer_range)
        return
    if not isinstance(module, QKVLinear):
        model._init_weights(module)
        return
    for part in "qkv":
        weight, bias = getattr(module, f"weight_{part}"), getattr(module, f"bias_{part}")
        linear = nn.Linear(
            weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device, dtype=weight.dtype
        )
        with seeded(qkv_part_unit(name, part)):
            model._init_weights(linear)
        weight.copy_(linear.weight)
        if bias is not None:
            bias.copy_(linear.bias)


def initial_values(
    model: nn.Module,
    rule: InitModule,
    *,
    seed: int,
    device: torch.device,
    names: Collection[str] | None = None,
    keep: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each parameter and buffer of `model` (a meta tree) with its initial value on `device`, one
    module at a time, in module order: only the modules owning a name in `names` (all when None).

    With `keep` the values stay in `model` (a whole build; tied parameters stay tied); otherwise each
    module returns to the meta device once its values were yielded. The torch RNG state is as before."""
    devices = [device] if device.type == "cuda" else []
    done: dict[int, torch.Tensor] = {}  # tied parameters: the first owner's value

    @contextlib.contextmanager
    def seeded(name: str) -> Iterator[None]:
        torch.manual_seed(unit_seed(seed, name))
        yield

    with torch.random.fork_rng(devices=devices), torch.no_grad():
        for name, module in model.named_modules():
            own = [
                (kind, key, tensor)
                for kind in ("_parameters", "_buffers")
                for key, tensor in getattr(module, kind).items()
                if tensor is not None
            ]
            full = {key: f"{name}.{key}" if name else key for _, key, _ in own}
            if not own or (names is not None and not any(full[key] in names for _, key, _ in own)):
                continue
            for kind, key, tensor in own:
                value = torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
                if kind == "_parameters":
                    value = nn.Parameter(value, tensor.requires_grad)
                getattr(module, kind)[key] = value
            with seeded(name):
                rule(name, module, seeded)
            for kind, key, tensor in own:
                if id(tensor) in done:  # a tied parameter keeps its first owner's value
                    getattr(module, kind)[key] = done[id(tensor)]
                    continue
                done[id(tensor)] = getattr(module, kind)[key]
                yield full[key], done[id(tensor)]
                if not keep:
                    getattr(module, kind)[key] = tensor
                    done[id(tensor)] = tensor  # a later owner reads nothing: it was yielded already
