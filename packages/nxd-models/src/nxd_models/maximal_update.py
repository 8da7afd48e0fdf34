"""muP, the maximal update parametrisation (Yang et al. 2022, Tensor Programs V), by the rules of Microsoft's
mup package, so that hyperparameters tuned on a narrow model hold on a wide one.

A base-shape file (mup's own YAML: per parameter, the base size of each dimension that grows with the model's width,
null for the others) says which dimensions are widths and how wide the tuned model was. From it each parameter
gets mup's `InfShape` reduced to what muP reads (`Width`): how many of its dimensions are widths and the width
multiplier of the last of them (the fan-in of a matrix). Then, as mup does:
- matrix-like weights (two width dimensions) draw with std / sqrt(multiplier); Adam steps them with lr / multiplier
  and weight decay x multiplier, SGD with lr / (fan-in multiplier / fan-out multiplier);
- vector-like ones (one width dimension: embeddings, the output layer, biases, norms) keep their draw and Adam's lr;
  SGD steps them with lr x multiplier;
- the output layer reads its input divided by its multiplier (mup's MuReadout), attention scores are divided by the
  head width d rather than sqrt(d) (GPT-NeoX's muP).
GPT-NeoX's temperatures and multipliers (`MupSpec`) scale the attention scores, the logits and the embeddings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from .errors import ModelConfigError

BaseShapes = Mapping[str, Sequence[int | None]]
"""Per parameter name, the base size of each width dimension and None for the others (mup's base shapes)."""
_COMMENT = """\
# This is a base shape file encoded in yaml
# - `null` indicates a dimension is "finite", i.e. a non-"width" dimension
# - a number indicates the base dimension of an "infinite" dimension, i.e. some notion of "width"
"""
"""The header mup's save_base_shapes writes, so that either tool reads the other's files."""
ADAM_LIKE = ("adam", "adamw", "adamw_fp32OptState")
"""Optimizers stepped by mup's MuAdam rule (entrywise-normalised updates)."""
SGD_LIKE = ("sgd",)
"""Optimizers stepped by mup's MuSGD rule."""


@dataclass(frozen=True)
class MupSpec:
    """muP's settings (plain values; nxd-train fills them from `model.mup`)."""

    base_shapes: tuple[tuple[str, tuple[int | None, ...]], ...]
    """The base-shape file's entries."""
    init_scale: float = 1.0
    """Every drawn weight is multiplied by it (GPT-NeoX's mup_init_scale)."""
    attention_temperature: float = 1.0
    """The attention scores are divided by it (GPT-NeoX's mup_attn_temp)."""
    output_temperature: float = 1.0
    """The logits are divided by it (GPT-NeoX's mup_output_temp)."""
    embedding_multiplier: float = 1.0
    """The embedding layer's output is multiplied by it (GPT-NeoX's mup_embedding_mult)."""


@dataclass(frozen=True)
class Width:
    """mup's InfShape of one parameter, as muP reads it."""

    widths: int
    """How many of its dimensions are widths (mup's ninf)."""
    multiplier: float
    """The last width dimension's size over its base size (mup's width_mult; the fan-in of a matrix); 1 without one."""
    fan_ratio: float
    """The fan-in dimension's multiplier over the fan-out's (mup's fanin_fanout_mult_ratio; the last two dimensions,
    so that stacked experts read as matrices)."""

    def init_factor(self, init_scale: float) -> float:
        """What a weight drawn at its usual std is multiplied by (mup's normal_, then NeoX's mup_init_scale)."""
        return init_scale / math.sqrt(self.multiplier) if self.widths == 2 else init_scale

    def optimizer_scales(self, optimizer: str) -> tuple[float, float]:
        """(learning rate, weight decay) multipliers of mup's MuAdam or MuSGD."""
        if self.widths > 2:
            raise ModelConfigError(
                f"model.mup: a parameter with {self.widths} width dimensions has no muP rule (mup handles two at most)"
            )
        if optimizer in ADAM_LIKE:
            return (1 / self.multiplier, self.multiplier) if self.widths == 2 else (1.0, 1.0)
        if optimizer in SGD_LIKE:
            if self.widths == 2:
                return 1 / self.fan_ratio, self.fan_ratio
            return (self.multiplier, 1 / self.multiplier) if self.widths == 1 else (1.0, 1.0)
        raise ModelConfigError(
            f"model.optim.name: muP has rules for {', '.join(ADAM_LIKE + SGD_LIKE)}; found {optimizer!r}"
        )


def base_shapes(base: Mapping[str, Sequence[int]], delta: Mapping[str, Sequence[int]]) -> dict[str, list[int | None]]:
    """mup's make_base_shapes: the dimensions that differ between a base model and a wider delta model are widths,
    kept at the base's size; the others are None."""
    if set(base) != set(delta):
        raise ModelConfigError(
            f"model.mup: the base and delta models' parameters differ: {', '.join(sorted(set(base) ^ set(delta)))}"
        )
    return {
        name: [b if b != d else None for b, d in zip(shape, delta[name], strict=True)] for name, shape in base.items()
    }


def widths(
    base: BaseShapes, shapes: Mapping[str, Sequence[int]], source: str = "model.mup.base_shapes_file"
) -> dict[str, Width]:
    """Each parameter's `Width` for a model of `shapes` (full, unsharded) against base shapes `base`."""
    missing, extra = sorted(set(shapes) - set(base)), sorted(set(base) - set(shapes))
    if missing or extra:
        parts = (
            missing and f"absent there: {', '.join(missing[:4])}",
            extra and f"not in the model: {', '.join(extra[:4])}",
        )
        found = "; ".join(part for part in parts if part)
        raise ModelConfigError(f"{source}: expected the base shapes of this model's parameters; {found}")
    result = {}
    for name, shape in shapes.items():
        bases = list(base[name])
        if len(bases) != len(shape):
            raise ModelConfigError(f"{source}: {name}: expected {len(shape)} dimensions, found {len(bases)}")
        multipliers = [size / b if b else 1.0 for b, size in zip(bases, shape, strict=True)]
        wide = [index for index, b in enumerate(bases) if b]
        fan_ratio = multipliers[-1] / multipliers[-2] if len(shape) >= 2 else 1.0
        result[name] = Width(len(wide), multipliers[wide[-1]] if wide else 1.0, fan_ratio)
    return result


def read_base_shapes(path: str | Path) -> tuple[tuple[str, tuple[int | None, ...]], ...]:
    """The entries of a base-shape file (mup's YAML), checked."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ModelConfigError(
            f"model.mup.base_shapes_file: {path}: no such file; write it with model.mup."
            "save_base_shapes (or mup's make_base_shapes)"
        ) from None
    except (OSError, yaml.YAMLError) as error:
        raise ModelConfigError(
            f"model.mup.base_shapes_file: {path}: expected mup's base shapes (YAML), found {str(error).splitlines()[0]}"
        ) from None
    if not isinstance(data, dict) or not all(
        isinstance(shape, list) and all(d is None or (isinstance(d, int) and d > 0) for d in shape)
        for shape in data.values()
    ):
        raise ModelConfigError(
            f"model.mup.base_shapes_file: {path}: expected a mapping of parameter names to lists "
            "of base sizes or null (mup's base shapes)"
        )
    return tuple((str(name), tuple(shape)) for name, shape in data.items())


def base_shapes_text(shapes: BaseShapes) -> str:
    """A base-shape file's text, as mup's save_base_shapes writes it."""
    return _COMMENT + yaml.dump({name: list(shape) for name, shape in shapes.items()}, None, indent=4)
