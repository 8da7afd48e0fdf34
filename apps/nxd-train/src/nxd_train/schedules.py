"""Learning-rate schedules of `model.optim.sched`, as NeMo 1.x defines them (NxDT inherits them).

Each schedule is a pure function step -> learning rate, wrapped in torch's LambdaLR, so that the value
used by the optimizer update of step s (counted from 0) is `lr_at(s)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from nxd_config.schema.optim import (
    CosineAnnealing,
    ExponentialLR,
    LinearAnnealingWithWarmUp,
    NoamAnnealing,
    SquareAnnealing,
    StepLR,
    WarmupAnnealing,
    WarmupHoldPolicy,
    WarmupPolicy,
)
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

Schedule = (
    LinearAnnealingWithWarmUp | CosineAnnealing | WarmupPolicy | WarmupHoldPolicy | SquareAnnealing
    | NoamAnnealing | WarmupAnnealing | StepLR | ExponentialLR
)  # fmt: skip


def _steps(count: int | None, ratio: float | None, max_steps: int) -> int:
    return count if count is not None else int(ratio * max_steps) if ratio is not None else 0


def schedule_function(sched: Schedule, lr: float, trainer_max_steps: int) -> Callable[[int], float]:
    """step -> learning rate for `sched` with peak `lr`; `max_steps` defaults to the run's length."""
    if isinstance(sched, StepLR):
        return lambda step: lr * sched.gamma ** (step // sched.step_size)
    if isinstance(sched, ExponentialLR):
        return lambda step: lr * sched.gamma**step
    max_steps = sched.max_steps or trainer_max_steps
    if isinstance(sched, LinearAnnealingWithWarmUp):
        warmup = sched.warmup_steps

        def linear(step: int) -> float:
            if step < warmup:
                return lr * step / max(1, warmup)
            return lr * max(0.0, (max_steps - step) / max(1, max_steps - warmup))

        return linear
    warmup = _steps(sched.warmup_steps, sched.warmup_ratio, max_steps)
    if isinstance(sched, NoamAnnealing):
        normalize = sched.d_model**-0.5

        def noam(step: int) -> float:
            step = max(1, step)
            mult = normalize * (min(step**-0.5, step * warmup**-1.5) if warmup > 0 else step**-0.5)
            return max(lr * mult, sched.min_lr) if step > warmup else lr * mult

        return noam
    min_lr = getattr(sched, "min_lr", 0.0)
    if isinstance(sched, CosineAnnealing):
        return _cosine(sched, lr, max_steps, warmup, min_lr)
    hold = _steps(sched.hold_steps, sched.hold_ratio, max_steps) if isinstance(sched, WarmupHoldPolicy) else 0

    def decay(step: int) -> float:
        if isinstance(sched, SquareAnnealing):
            return max(lr * ((max_steps - step) / (max_steps - warmup)) ** 2, min_lr)
        if isinstance(sched, WarmupAnnealing):
            return min_lr + (1 - (step - warmup) / (max_steps - warmup)) * (lr - min_lr)
        return lr  # WarmupPolicy, WarmupHoldPolicy: constant after warmup (and hold)

    def warmup_policy(step: int) -> float:
        if warmup > 0 and step <= warmup:
            return lr * (step + 1) / (warmup + 1)
        if warmup <= step < warmup + hold:
            return lr
        if step > max_steps:
            return min_lr
        return decay(step)

    return warmup_policy


def _cosine(sched: CosineAnnealing, lr: float, max_steps: int, warmup: int, min_lr: float) -> Callable[[int], float]:
    constant = _steps(sched.constant_steps, sched.constant_ratio, max_steps)
    decay_steps = max_steps - (constant + warmup)

    def cosine(step: int) -> float:
        if warmup > 0 and step <= warmup:
            return lr * (step + 1) / (warmup + 1)
        if constant > 0 and warmup + decay_steps < step <= max_steps:
            return min_lr
        if step > max_steps:
            return min_lr
        if constant == 0:
            return (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (max_steps - warmup))) + min_lr
        return min_lr + 0.5 * (math.cos(math.pi * (step - warmup) / decay_steps) + 1.0) * (lr - min_lr)

    return cosine


def build_scheduler(optimizer: Optimizer, sched: Schedule | None, lr: float, trainer_max_steps: int) -> LRScheduler:
    """A LambdaLR over every parameter group (a constant one when `sched` is None)."""
    if sched is None or lr == 0:
        return LambdaLR(optimizer, lambda step: 1.0)
    function = schedule_function(sched, lr, trainer_max_steps)
    return LambdaLR(optimizer, lambda step: function(step) / lr)
