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

DEEPSPEED_SCHEDULES = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest")


def deepspeed_schedule(kind: str, p: Mapping[str, Any], lr: float
                       ) -> tuple[Callable[[int], float], Callable[[int], float] | None]:  # fmt: skip
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
        low, high = p.get("warmup_min_lr", 0.0), p.get("warmup_max_lr", 0.001)

        def gamma(i: int) -> float:
            if i < warmup:
                return rise(max(i, 0))
            if kind == "WarmupLR":
                return 1.0
            return max(0.0, (total - i) / max(1.0, total - warmup))

        return lambda step: low + (high - low) * gamma(step - 1), None
    if kind == "LRRangeTest":
        low, size = p.get("lr_range_test_min_lr", 1e-3), p.get("lr_range_test_step_size", 2000)
        rate, stairs = p.get("lr_range_test_step_rate", 1.0), p.get("lr_range_test_staircase", False)

        def range_test(step: int) -> float:
            i = max(step - 1, 0)
            return low * (1 + rate * (math.floor(i / size) if stairs else i / size))

        return range_test, None
    return _one_cycle(p)


def _one_cycle(p: Mapping[str, Any]) -> tuple[Callable[[int], float], Callable[[int], float] | None]:
    low, high = p["cycle_min_lr"], p["cycle_max_lr"]
    first = float(p.get("cycle_first_step_size", 2000))
    second = float(p.get("cycle_second_step_size") or first)
    total, rising = first + second, first / (first + second)
    decay_size = p.get("decay_step_size", 0)
    low_mom, high_mom = p.get("cycle_min_mom", 0.8), p.get("cycle_max_mom", 0.9)

    def scale(i: int) -> float:
        x = 1.0 + i / total - math.floor(1 + i / total)
        return x / rising if x <= rising else (x - 1) / (rising - 1)

    def decay(i: int) -> float:  # decay_step_size 0: no decay after the cycle, as DeepSpeed documents it
        return (i - total) / decay_size if decay_size else 0.0

    def rate(step: int) -> float:
        i = step - 1
        if i < 0:
            return low
        if i <= total:
            return low + (high - low) * scale(i)
        return low * (1 + p.get("decay_lr_rate", 0.0) * decay(i))

    def momentum(step: int) -> float:
        i = step - 1
        if i < 0:
            return low_mom
        if i <= total:
            return high_mom - (high_mom - low_mom) * scale(i)
        return high_mom * (1 + p.get("decay_mom_rate", 0.0) * decay(i))

    return rate, momentum if p.get("cycle_momentum", True) else None
