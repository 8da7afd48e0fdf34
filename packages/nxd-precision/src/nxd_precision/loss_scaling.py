"""Loss scaling for fp16 training, as DeepSpeed applies it (deepspeed/runtime/fp16/loss_scaler.py).

fp16 gradients underflow to zero below 2^-24; multiplying the loss by a scale S before the backward lifts
them into range, and the fp32 master gradients are divided by S before clipping and the update. A static
scale stays fixed. A dynamic one starts at 2^initial_scale_power; a step whose gradients overflow (a
non-finite value anywhere) updates nothing and, once `hysteresis` overflows have been absorbed, halves the
scale (never below `min_loss_scale`); every `loss_scale_window` steps after the last overflow the scale
doubles and the hysteresis is restored (after every clean step with `consecutive_hysteresis`). The scale,
the hysteresis left and the steps counted are state a checkpoint keeps, so a resumed run continues with the
same scale.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import PrecisionConfigError


@dataclass(frozen=True)
class LossScaling:
    """The settings: `loss_scale` > 0 is a static scale; 0 scales dynamically from 2^initial_scale_power."""

    loss_scale: float = 0.0
    initial_scale_power: int = 16
    loss_scale_window: int = 1000
    hysteresis: int = 2
    min_loss_scale: float = 1.0
    consecutive_hysteresis: bool = False
    """Restore the hysteresis after every step without an overflow (not only when the scale grows)."""

    def __post_init__(self) -> None:
        problems = [
            f"precision.{name}: expected {what}, found {value}"
            for name, value, what in (
                ("loss_scale", self.loss_scale, "0 (dynamic) or a positive scale"),
                ("loss_scale_window", self.loss_scale_window, "at least 1 step"),
                ("hysteresis", self.hysteresis, "at least 1 overflow"),
                ("min_loss_scale", self.min_loss_scale, "a positive scale"),
            )
            if (value < 0 if name == "loss_scale" else value <= 0)
        ]
        if problems:
            raise PrecisionConfigError("; ".join(problems))

    @property
    def dynamic(self) -> bool:
        return self.loss_scale == 0


@dataclass
class LossScaler:
    """The scale of the coming step and its update after each step (`update(overflow)`)."""

    settings: LossScaling
    scale: float = field(init=False)
    hysteresis_left: int = field(init=False)
    step: int = 0
    """Steps updated so far."""
    last_overflow: int = -1
    """The step of the latest overflow (-1: none yet)."""
    skipped: int = 0
    """Steps skipped for an overflow the scale took (a smaller scale or the hysteresis came next)."""

    def __post_init__(self) -> None:
        s = self.settings
        self.scale = float(s.loss_scale) if not s.dynamic else float(2**s.initial_scale_power)
        self.hysteresis_left = s.hysteresis

    @property
    def at_minimum(self) -> bool:
        """Whether an overflow now could no longer lower the scale (static, or dynamic at its floor)."""
        s = self.settings
        return not s.dynamic or (self.scale <= s.min_loss_scale and self.hysteresis_left <= 1)

    @property
    def floor(self) -> str:
        """Why an overflow can no longer be taken, in the settings' words."""
        if not self.settings.dynamic:
            return f"the static fp16 loss scale precision.loss_scale {self.scale:g} overflows"
        return f"the fp16 loss scale is at its floor, precision.min_loss_scale {self.settings.min_loss_scale:g}"

    @torch.no_grad()
    def unscale_(self, tensors: Iterable[torch.Tensor]) -> None:
        """Divide the gradients of `tensors` (made from the loss times this scale) by the scale, in place."""
        if self.scale != 1.0:
            for tensor in tensors:
                if tensor.grad is not None:
                    tensor.grad.mul_(1.0 / self.scale)

    def update(self, overflow: bool) -> bool:
        """After a step whose gradients overflowed or not: on overflow, absorb it in the hysteresis or halve the
        scale; otherwise double the scale every loss_scale_window steps since the last overflow. True when the
        step must be skipped as a taken overflow; False for a clean step, and for an overflow the scale could no
        longer take (static, or at its floor), which is then a non-finite step like any other."""
        s, absorbed = self.settings, overflow and not self.at_minimum
        if s.dynamic and overflow:
            if self.hysteresis_left <= 1:
                self.scale = max(self.scale / 2.0, s.min_loss_scale)
            else:
                self.hysteresis_left -= 1
            self.last_overflow = self.step
        elif s.dynamic:
            if s.consecutive_hysteresis:
                self.hysteresis_left = s.hysteresis
            if (self.step - self.last_overflow) % s.loss_scale_window == 0:
                self.hysteresis_left = s.hysteresis
                self.scale *= 2.0
        self.skipped += absorbed
        self.step += 1
        return absorbed

    def state_dict(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "hysteresis_left": self.hysteresis_left,
            "step": self.step,
            "last_overflow": self.last_overflow,
            "skipped": self.skipped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale, self.hysteresis_left = float(state["scale"]), int(state["hysteresis_left"])
        self.step, self.last_overflow = int(state["step"]), int(state["last_overflow"])
        self.skipped = int(state["skipped"])
