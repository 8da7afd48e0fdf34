"""The registry of decoder-layer kinds (`GPTConfig.attention_layers`): what each kind is, as data.

A kind declares its `LayerKind` records in its own module, in the spirit of Megatron-Core's ModuleSpec; the shared model
code (building, initialisation, the tensor-parallel plan, FLOPs, the GPT-NeoX layout, a config's problems) asks the
registry instead of testing names. A new kind is its own module plus its entry in nxd-config's schema: it builds its
block, names its settings (a dataclass in `GPTConfig.layer_settings`) and says what it supports.

Two shapes of kind: a transformer layer (attention and an MLP, `build` None: dense and the block-sparse layouts,
which only change what the attention may see), and a block in place of both (`build` given: gMLP, Mamba, RWKV),
whole on every tensor-parallel rank.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

from torch import nn

from .errors import ModelConfigError


@dataclass(frozen=True)
class LayerKind:
    """One kind of decoder layer. A hook left None means the kind adds nothing there; `config` is the model's
    `GPTConfig` (typed Any: the registry sits below the decoder that reads it)."""

    name: str
    """The name `attention_layers` gives it."""
    build: Callable[[Any, int], nn.Module] | None = None
    """A block in place of attention and MLP: (config, layer number, 1-based) -> the layer, called as a transformer
    layer is (hidden, rotary, allowed, documents, cache, position_bias); None: the transformer layer."""
    settings: type | None = None
    """The dataclass of the kind's settings: `GPTConfig.settings(name)` finds it in layer_settings, else its
    defaults."""
    attention_layout: Callable[[Any, str, int], Any] | None = None
    """A transformer kind whose attention follows a layout: (config, kind, layer number) -> the layout
    (`BlockSparseLayout`), which masks the attention core's scores; None: causal attention."""
    init: Callable[[str, nn.Module], bool] | None = None
    """The kind's own draw of a module's own tensors (name within the model, module); True when it drew them, False
    to leave the module to the model's init methods."""
    output_projections: tuple[str, ...] = ()
    """Name endings of the block's linear layers that write the residual stream: drawn by output_layer_init_method
    (as o_proj and down_proj are)."""
    tp_plan: Mapping[str, str] = field(default_factory=dict)
    """A block's tensor-parallel entries, by module name within the layer ("input_layernorm": "sequence"); the rest
    of a block is whole on every rank. A transformer kind takes the transformer layer's entries."""
    flops: Callable[[nn.Module, int], int] | None = None
    """Training FLOPs per token of one module (any module of a model; 0 for those not the kind's) beyond 6 x the
    weights of its linear layers, which are counted already: (module, seq_length) -> FLOPs."""
    problems: Callable[[Any, set[str]], list[str]] | None = None
    """What a config using the kind gets wrong, in the words of nxd's keys: (config, the kinds in use) -> messages.
    Kinds sharing one function are asked once."""
    splits_activation: bool = False
    """The block splits its inner activations into a value and a gate itself (it refuses a gated activation)."""
    scans: bool = False
    """The block scans the sequence from its start (no soft prompt can stand before every packed document)."""
    reads_row_positions: bool = False
    """The layer's output at a token depends on the token's place in its row (gMLP's spatial projection, a block-sparse
    layout), not only on its document's tokens and position ids: a document packed after others computes otherwise
    than alone."""
    neox_layout: bool | None = None
    """Whether nxd reads and writes the kind in GPT-NeoX checkpoints; None: a transformer kind does, a block does
    not."""

    @property
    def is_block(self) -> bool:
        """Whether the kind replaces attention and MLP with a block of its own."""
        return self.build is not None

    @property
    def has_neox_layout(self) -> bool:
        return not self.is_block if self.neox_layout is None else self.neox_layout


DENSE = LayerKind("dense")
"""Full causal attention and an MLP."""

_BUILT_IN = ("sparse_attention", "spatial_gating", "selective_state_space", "rwkv")
"""The modules of the kinds nxd ships (each declares its records as `KINDS`), in the order messages list them."""
_KINDS: dict[str, LayerKind] = {}
_plug_ins: dict[str, LayerKind] = {}


def _load_built_ins() -> dict[str, LayerKind]:
    if not _KINDS:
        built_in = [DENSE] + [kind for module in _BUILT_IN for kind in import_module(f".{module}", __package__).KINDS]
        _KINDS.update((kind.name, kind) for kind in built_in)
    return _KINDS


def register_layer_kind(kind: LayerKind) -> LayerKind:
    """Add a kind nxd does not ship (by its name) to those a config may name; returns it. A name taken is refused."""
    if kind.name in _load_built_ins() or kind.name in _plug_ins:
        raise ModelConfigError(f"layer kind {kind.name!r} is registered already")
    _plug_ins[kind.name] = kind
    return kind


def unregister_layer_kind(name: str) -> None:
    """Remove a kind `register_layer_kind` added (a test's, or a plug-in's being unloaded)."""
    if name not in _plug_ins:
        raise ModelConfigError(f"layer kind {name!r} is not a registered plug-in kind")
    del _plug_ins[name]


def layer_kinds() -> tuple[LayerKind, ...]:
    """Every registered kind, the built-in ones first."""
    return (*_load_built_ins().values(), *_plug_ins.values())


def layer_kind(name: str) -> LayerKind:
    """The kind named `name`; ModelConfigError naming the registered ones for any other."""
    kind = _load_built_ins().get(name) or _plug_ins.get(name)
    if kind is None:
        names = ", ".join(kind.name for kind in layer_kinds())
        raise ModelConfigError(f"model.attention_layers: expected kinds among {names}, found {name}")
    return kind


def kinds_of(config: Any) -> tuple[LayerKind, ...]:
    """The distinct kinds `config`'s layers use, in registry order (dense alone without attention_layers)."""
    used = set(config.attention_layers or (DENSE.name,))
    return tuple(kind for kind in layer_kinds() if kind.name in used)


def names_list(names: list[str]) -> str:
    """a, b or c."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
