"""DeepSpeed's learning-rate schedules (deepspeed/runtime/lr_schedules.py: WarmupLR, WarmupDecayLR, WarmupCosineLR,
OneCycle, LRRangeTest) as functions of nxd's step.

DeepSpeed's scheduler sets the rates when it is built (its iteration -1) and steps after each optimizer update, so
the update of step s (counted from 0) uses its value at iteration s - 1. OneCycle also cycles Adam's first moment
coefficient (betas[0]) inversely to the rate; DeepSpeed sets betas[1] to 0.99 as it does so, nxd keeps the
optimizer's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any


def deepspeed_schedule(
    kind: str, p: Mapping[str, Any], lr: float
) -> tuple[Callable[[int], float], Callable[[int], float] | None]:
    """(step -> learning rate, step -> betas[0] or None) of DeepSpeed's schedule `kind` with its params `p` (absent
    ones take DeepSpeed's defaults); `lr` is the optimizer's rate, which only WarmupCosineLR scales."""
    if kind in ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR"):
        warmup = max(2, p.get("warmup_num_steps", 1000))
        log = p.get("warmup_type", "log") == "log"

        def rise(i: int) -> float:
            return math.log(i + 1) / math.log(warmup) if log else i / warmup

        total = p.get("total_num_steps", 0)
        if kind == "WarmupCosineLR":
            low, floor = p.get("warmup_min_ratio", 0.0), p.get("cos_min_ratio", 0.0001)

            def ratio(i: int) -> float:
                if i < 0:
                    return 0.0  # DeepSpeed's rate before its first step
                if i < warmup:
                    return low + rise(i) * (1.0 - low)
                cosine = (1 + math.cos(math.pi * (i - warmup + 1) / (total - warmup))) / 2
                return max(0.0, floor + (1.0 - floor) * cosine)

            return lambda step: lr * ratio(step - 1), None
        low = p.get("warmup_min_lr", 0.0)
        high = lr if p.get("warmup_max_lr") is None else p["warmup_max_lr"]  # DeepSpeed's default: the optimizer's

        def gamma(i: int) -> float:
            if i < warmup:
                return rise(max(i, 0))
            if kind == "WarmupLR":
                return 1.0
            return max(0.0, (total - i) / max(1.0, total - warmup))

        return lambda step: low + (high - low) * gamma(step - 1), None
    if kind == "LRRangeTest":  # iteration i grows by its (i + 1) / step_size intervals: step s by s / step_size
        low, size = p.get("lr_range_test_min_lr", 1e-3), p.get("lr_range_test_step_size", 2000)
        rate, stairs = p.get("lr_range_test_step_rate", 1.0), p.get("lr_range_test_staircase", False)
        return lambda step: low * (1 + rate * (math.floor(step / size) if stairs else step / size)), None
    return _one_cycle(p)


def _one_cycle(p: Mapping[str, Any]) -> tuple[Callable[[int], float], Callable[[int], float] | None]:
    """OneCycle at iteration i = s - 1: within the cycle (i < its length) the position (i + 1) / length rises
    to cycle_max_lr over the first part and falls back over the second, momentum the other way; after it, the
    rate is cycle_min_lr / (1 + decay_lr_rate x intervals) and the momentum cycle_max_mom x (1 + decay_mom_rate x
    intervals), the intervals (i - length + 1) / decay_step_size; a zero decay_step_size or rate keeps both."""
    low, high = p["cycle_min_lr"], p["cycle_max_lr"]
    first = float(p.get("cycle_first_step_size", 2000))
    second = float(p.get("cycle_second_step_size") or first)
    total, rising = first + second, first / (first + second)
    decay_size = p.get("decay_step_size", 0)
    lr_rate, mom_rate = p.get("decay_lr_rate", 0.0), p.get("decay_mom_rate", 0.0)
    low_mom, high_mom = p.get("cycle_min_mom", 0.8), p.get("cycle_max_mom", 0.9)

    def scale(step: int) -> float:
        x = 1.0 + step / total - math.floor(1 + step / total)
        return x / rising if x <= rising else (x - 1) / (rising - 1)

    def intervals(step: int) -> float:
        return (step - total) / decay_size

    def rate(step: int) -> float:
        if step < 1:
            return low  # the constructor's
        if step - 1 < total:
            return low + (high - low) * scale(step)
        if math.isclose(decay_size, 0) or math.isclose(lr_rate, 0):
            return low
        return low / (1 + lr_rate * intervals(step))

    def momentum(step: int) -> float:
        if step < 1:
            return low_mom  # the constructor's
        if step - 1 < total:
            return high_mom - (high_mom - low_mom) * scale(step)
        if math.isclose(decay_size, 0) or math.isclose(mom_rate, 0):
            return high_mom
        return high_mom * (1 + mom_rate * intervals(step))

    return rate, momentum if p.get("cycle_momentum", True) else None
