"""Learning-rate schedules by the names of NxDT's `model.optim.sched`, as NeMo 1.x defines them.

Each schedule is a pure function step -> learning rate, wrapped in torch's LambdaLR, so that the value
used by the optimizer update of step s (counted from 0) is `lr_at(s)`. Options arrive as the config's
keys under their own names (warmup_steps, warmup_ratio, min_lr, ...); a missing one takes NeMo's default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from .deepspeed_schedules import deepspeed_schedule
from .errors import PrecisionConfigError

SCHEDULE_NAMES = (
    "LinearAnnealingWithWarmUp",
    "CosineAnnealing",
    "WarmupPolicy",
    "WarmupHoldPolicy",
    "SquareAnnealing",
    "NoamAnnealing",
    "WarmupAnnealing",
    "StepLR",
    "ExponentialLR",
    "NeoXAnnealing",
    "TransformersSchedule",
    "DeepSpeedSchedule",
)
_MIN_LR = {"SquareAnnealing": 1e-5}
"""NeMo's default min_lr where it is not 0."""


def _steps(count: int | None, ratio: float | None, max_steps: int) -> int:
    return count if count is not None else int(ratio * max_steps) if ratio is not None else 0


def schedule_function(name: str, options: Mapping[str, Any], lr: float, run_steps: int) -> Callable[[int], float]:
    """step -> learning rate of schedule `name` with peak `lr`; its `max_steps` defaults to `run_steps`."""
    if name not in SCHEDULE_NAMES:
        raise PrecisionConfigError(
            f"model.optim.sched.name: expected one of {', '.join(SCHEDULE_NAMES)}, found {name!r}"
        )
    if name == "DeepSpeedSchedule":
        return deepspeed_schedule(options["type"], options, lr)[0]
    if name == "StepLR":
        return lambda step: lr * options.get("gamma", 0.1) ** (step // options["step_size"])
    if name == "ExponentialLR":
        return lambda step: lr * options.get("gamma", 0.9) ** step
    max_steps = options.get("max_steps") or run_steps
    if name == "TransformersSchedule":
        return transformers_schedule(
            lr, options.get("type", "linear"), max_steps, options.get("warmup_steps"), options.get("warmup_ratio")
        )
    if name == "NeoXAnnealing":
        return neox_annealing(
            lr,
            max_steps,
            options.get("warmup_ratio", 0.01),
            options.get("decay_style", "linear"),
            options.get("min_lr", 0.0),
        )
    if name == "LinearAnnealingWithWarmUp":
        linear_warmup = options.get("warmup_steps") or 0

        def linear(step: int) -> float:
            if step < linear_warmup:
                return lr * step / max(1, linear_warmup)
            return lr * max(0.0, (max_steps - step) / max(1, max_steps - linear_warmup))

        return linear
    warmup = _steps(options.get("warmup_steps"), options.get("warmup_ratio"), max_steps)
    min_lr = options.get("min_lr", _MIN_LR.get(name, 0.0))
    if name == "NoamAnnealing":
        normalize = options["d_model"] ** -0.5

        def noam(step: int) -> float:
            step = max(1, step)
            mult = normalize * (min(step**-0.5, step * warmup**-1.5) if warmup > 0 else step**-0.5)
            return max(lr * mult, min_lr) if step > warmup else lr * mult

        return noam
    if name == "CosineAnnealing":
        constant = _steps(options.get("constant_steps"), options.get("constant_ratio"), max_steps)
        return _cosine(lr, max_steps, warmup, constant, min_lr)
    hold = _steps(options.get("hold_steps"), options.get("hold_ratio"), max_steps) if name == "WarmupHoldPolicy" else 0

    def decay(step: int) -> float:
        if name == "SquareAnnealing":
            return max(lr * ((max_steps - step) / (max_steps - warmup)) ** 2, min_lr)
        if name == "WarmupAnnealing":
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


def transformers_schedule(
    lr: float, kind: str, max_steps: int, warmup_steps: int | None, warmup_ratio: float | None
) -> Callable[[int], float]:
    """transformers' schedule `kind` (its `get_scheduler`) with peak `lr` over `max_steps`: the warmup is
    warmup_steps when given and positive, else ceil(warmup_ratio x max_steps), as TrainingArguments counts it."""
    try:
        from transformers import get_scheduler
    except ImportError:
        raise PrecisionConfigError(
            "model.optim.sched.name: TransformersSchedule needs transformers (pip install "
            "'nxd-precision[schedules]'), which is not installed"
        ) from None

    warmup = warmup_steps if warmup_steps else math.ceil((warmup_ratio or 0.0) * max_steps)
    holder = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    factor = get_scheduler(kind, holder, num_warmup_steps=warmup, num_training_steps=max_steps).lr_lambdas[0]
    return lambda step: lr * factor(step)


def neox_annealing(
    lr: float, decay_steps: int, warmup_ratio: float, style: str, min_lr: float
) -> Callable[[int], float]:
    """GPT-NeoX's AnnealingLR (megatron/learning_rates.py) at step s: linear warmup over warmup_ratio x
    decay_steps steps (a fraction of a step counts; step 0 takes step 1's rate), then `style` over the steps from
    warmup to decay_steps, floored at min_lr. Nothing stops the decay at decay_steps: linear stays at min_lr and
    cosine climbs again, as in NeoX."""
    warmup = warmup_ratio * decay_steps
    span = decay_steps - warmup

    def annealing(step: int) -> float:
        if warmup > 0 and step <= warmup:
            return lr * max(1, step) / warmup
        done = step - warmup
        if style == "linear":
            value = lr * (span - done) / span
        elif style == "cosine":
            value = min_lr + (lr - min_lr) / 2.0 * (math.cos(math.pi * done / span) + 1)
        elif style == "exponential":
            value = lr * math.exp(-0.693 * done / span)
        else:
            value = lr
        return max(value, min_lr)

    return annealing


def _cosine(lr: float, max_steps: int, warmup: int, constant: int, min_lr: float) -> Callable[[int], float]:
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


def build_scheduler(
    optimizer: Optimizer, name: str | None, options: Mapping[str, Any], lr: float, run_steps: int
) -> LRScheduler:
    """A LambdaLR over every parameter group: schedule `name` (None: a constant learning rate)."""
    if name is None or lr == 0:
        return LambdaLR(optimizer, lambda step: 1.0)
    if name == "DeepSpeedSchedule":
        function, momentum = deepspeed_schedule(options["type"], options, lr)
        if momentum is not None:
            return MomentumSchedule(optimizer, lambda step: function(step) / lr, momentum)
    else:
        function = schedule_function(name, options, lr, run_steps)
    return LambdaLR(optimizer, lambda step: function(step) / lr)


class MomentumSchedule(LambdaLR):
    """A LambdaLR that also sets each group's betas[0] at every step (DeepSpeed's OneCycle cycles Adam's momentum);
    groups without betas keep theirs, as DeepSpeed leaves an optimizer without betas alone."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float], momentum: Callable[[int], float]):
        self.momentum = momentum
        super().__init__(optimizer, lr_lambda)

    def step(self, epoch: int | None = None) -> None:
        super().step(epoch)
        self.set_momentum()

    def state_dict(self) -> dict[str, Any]:
        """LambdaLR's state without the momentum function (a checkpoint holds values; the run supplies it)."""
        return {key: value for key, value in super().state_dict().items() if key != "momentum"}

    def set_momentum(self) -> None:
        beta = self.momentum(self.last_epoch)
        for group in self.optimizer.param_groups:
            if "betas" in group:
                group["betas"] = (beta, group["betas"][1])


def apply_schedule(scheduler: LRScheduler, lr: float) -> None:
    """Make a schedule loaded from a checkpoint (torch's load_state_dict brings back the saved base learning
    rates) this run's: base learning rate `lr`, and the current step's value set on the optimizer now, so
    the first update after a resume already uses it."""
    groups = scheduler.optimizer.param_groups
    scheduler.base_lrs = [lr * group.get("lr_scale", 1.0) for group in groups]  # muP's groups keep their scale
    step = scheduler.last_epoch
    values = [base * factor(step) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, value, base in zip(groups, values, scheduler.base_lrs, strict=True):
        group["lr"] = value
        group["initial_lr"] = base
    scheduler._last_lr = values  # what get_last_lr() reports, as torch's step() sets it
    if isinstance(scheduler, MomentumSchedule):
        scheduler.set_momentum()
