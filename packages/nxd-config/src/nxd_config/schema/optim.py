"""`model.optim` and `model.optim.sched`: every optimizer and LR scheduler the reference names.

Each name selects its own parameter set (NeMo 1.x's optimizer and scheduler parameter classes,
which the reference points to), so a parameter that the chosen optimizer does not take is an
unknown key, not a silently ignored one.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from ._base import NoneString, Section, Status, frozen_list, key

APP = "nxd-train"

_Pair = Annotated[frozen_list(float), Field(min_length=2, max_length=2)]
_Betas = Annotated[frozen_list(Annotated[float, Field(ge=0.0, lt=1.0)]), Field(min_length=2, max_length=2)]
"""Running-average coefficients: each in [0, 1), or the averages never forget (1) or diverge (above)."""

# --------------------------------------------------------------------------- schedulers


class _Scheduler(Section):
    max_steps: int | None = key(None, "Step at which the schedule ends; null uses trainer.max_steps.", by=APP, ge=1)


class _Warmup(_Scheduler):
    warmup_steps: int | None = key(None, "Linear warmup length in steps.", by=APP, ge=0)
    warmup_ratio: float | None = key(None, "Warmup length as a fraction of max_steps.", by=APP, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _one_warmup(self) -> _Warmup:
        if self.warmup_steps is not None and self.warmup_ratio is not None:
            raise ValueError("expected warmup_steps or warmup_ratio, found both set")
        return self


class LinearAnnealingWithWarmUp(_Scheduler):
    name: Literal["LinearAnnealingWithWarmUp"]
    warmup_steps: int = key(0, "Linear warmup from 0 to lr over this many steps, then linear decay to 0.", by=APP, ge=0)


class CosineAnnealing(_Warmup):
    name: Literal["CosineAnnealing"]
    constant_steps: int | None = key(None, "Steps held at min_lr at the end of the schedule.", by=APP, ge=0)
    constant_ratio: float | None = key(None, "constant_steps as a fraction of max_steps.", by=APP, ge=0.0, le=1.0)
    min_lr: float = key(0.0, "Learning rate reached at the end of the cosine decay.", by=APP, ge=0.0)

    @model_validator(mode="after")
    def _one_constant(self) -> CosineAnnealing:
        if self.constant_steps is not None and self.constant_ratio is not None:
            raise ValueError("expected constant_steps or constant_ratio, found both set")
        return self


class WarmupPolicy(_Warmup):
    name: Literal["WarmupPolicy"]


class WarmupHoldPolicy(_Warmup):
    name: Literal["WarmupHoldPolicy"]
    hold_steps: int | None = key(None, "Steps held at lr after warmup.", by=APP, ge=0)
    hold_ratio: float | None = key(None, "hold_steps as a fraction of max_steps.", by=APP, ge=0.0, le=1.0)
    min_lr: float = key(0.0, "Lower bound of the learning rate.", by=APP, ge=0.0)


class SquareAnnealing(_Warmup):
    name: Literal["SquareAnnealing"]
    min_lr: float = key(1e-5, "Learning rate reached at max_steps.", by=APP, ge=0.0)


class NoamAnnealing(_Warmup):
    name: Literal["NoamAnnealing"]
    d_model: int = key(..., "Model width in the Noam formula lr * d_model^-0.5 * min(...).", by=APP, ge=1)
    min_lr: float = key(0.0, "Lower bound of the learning rate.", by=APP, ge=0.0)


class WarmupAnnealing(_Warmup):
    name: Literal["WarmupAnnealing"]
    min_lr: float = key(0.0, "Learning rate reached at max_steps (linear decay after warmup).", by=APP, ge=0.0)


class NeoXAnnealing(_Scheduler):
    """GPT-NeoX's AnnealingLR: a linear warmup over a fraction of the decay horizon, then a decay of the chosen
    style; min_lr floors the rate after warmup, and nothing stops the decay at the horizon (as in NeoX)."""

    name: Literal["NeoXAnnealing"] = key(
        ..., "GPT-NeoX's AnnealingLR.", by=APP, status=Status.EXTENSION, note="GPT-NeoX's learning-rate schedule"
    )
    decay_style: Literal["constant", "linear", "cosine", "exponential"] = key(
        "linear",
        "After warmup, at n steps past it over the E steps from warmup to max_steps: constant lr; linear "
        "lr (E - n) / E; cosine min_lr + (lr - min_lr) (1 + cos(pi n / E)) / 2; exponential lr exp(-0.693 n / E).",
        by=APP,
        status=Status.EXTENSION,
        note="GPT-NeoX's lr_decay_style",
    )
    warmup_ratio: float = key(
        0.01,
        "Warmup length as a fraction of max_steps (a fraction of a step counts): step s uses "
        "lr max(1, s) / (warmup_ratio max_steps) while s <= that length.",
        by=APP,
        ge=0.0,
        lt=1.0,
        status=Status.EXTENSION,
        note="GPT-NeoX's warmup",
    )
    min_lr: float = key(
        0.0,
        "Floor of the learning rate after warmup.",
        by=APP,
        ge=0.0,
        status=Status.EXTENSION,
        note="GPT-NeoX's min_lr",
    )


class TransformersSchedule(Section):
    """A schedule of transformers' `get_scheduler`, by its name there, so runs written for the Trainer (or
    TRL) follow its learning rates exactly."""

    name: Literal["TransformersSchedule"] = key(
        ..., "transformers' schedules.", by=APP, status=Status.EXTENSION, note="transformers' get_scheduler"
    )
    type: Literal[
        "linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", "inverse_sqrt"
    ] = key(
        "linear",
        "transformers' SchedulerType name; the schedule runs over max_steps.",
        by=APP,
        status=Status.EXTENSION,
        note="TrainingArguments.lr_scheduler_type",
    )
    warmup_steps: int | None = key(
        None,
        "Warmup length in steps (wins over warmup_ratio).",
        by=APP,
        ge=0,
        status=Status.EXTENSION,
        note="TrainingArguments.warmup_steps",
    )
    warmup_ratio: float | None = key(
        None,
        "Warmup length as a fraction of max_steps, rounded up as the Trainer rounds it.",
        by=APP,
        ge=0.0,
        lt=1.0,
        status=Status.EXTENSION,
        note="TrainingArguments.warmup_ratio",
    )
    max_steps: int | None = key(
        None,
        "Steps the schedule spans; null uses the run's optimizer steps.",
        by=APP,
        ge=1,
        status=Status.EXTENSION,
        note="TrainingArguments.max_steps",
    )


_DS = "DeepSpeed's scheduler params"


class DeepSpeedSchedule(Section):
    """One of DeepSpeed's learning-rate schedules with its params (their names and defaults are DeepSpeed's); the
    update of step s uses DeepSpeed's value at its iteration s - 1, as DeepSpeed steps its scheduler after each
    update."""

    name: Literal["DeepSpeedSchedule"] = key(
        ..., "DeepSpeed's schedules.", by=APP, status=Status.EXTENSION, note="DeepSpeed's scheduler block"
    )
    type: Literal["WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"] = key(
        ...,
        "WarmupLR: warmup_min_lr to warmup_max_lr over warmup_num_steps (log or linear), then constant; "
        "WarmupDecayLR: then linear to 0 at total_num_steps; WarmupCosineLR: ratios of model.optim.lr, cosine to "
        "cos_min_ratio at total_num_steps; OneCycle: cycle_min_lr up to cycle_max_lr over cycle_first_step_size, "
        "down over cycle_second_step_size, then decay_lr_rate every decay_step_size, with Adam's betas[0] cycled "
        "inversely between cycle_min_mom and cycle_max_mom (cycle_momentum); LRRangeTest: lr_range_test_min_lr "
        "grown by lr_range_test_step_rate every lr_range_test_step_size steps.",
        by=APP,
        status=Status.EXTENSION,
        note="DeepSpeed's scheduler type",
    )
    warmup_min_lr: float = key(
        0.0, "WarmupLR, WarmupDecayLR: the first rate.", by=APP, ge=0.0, status=Status.EXTENSION, note=_DS
    )
    warmup_max_lr: float | None = key(
        None,
        "WarmupLR, WarmupDecayLR: the rate after warmup; null: model.optim.lr.",
        by=APP,
        ge=0.0,
        status=Status.EXTENSION,
        note=_DS,
    )
    warmup_num_steps: int = key(
        1000, "Warmup steps (at least 2, as DeepSpeed takes it).", by=APP, ge=0, status=Status.EXTENSION, note=_DS
    )
    warmup_type: Literal["log", "linear"] = key(
        "log", "The warmup's rise: log(i + 1) / log(n) or i / n.", by=APP, status=Status.EXTENSION, note=_DS
    )
    total_num_steps: int | None = key(
        None,
        "WarmupDecayLR, WarmupCosineLR: where the decay ends (required).",
        by=APP,
        ge=1,
        status=Status.EXTENSION,
        note=_DS,
    )
    warmup_min_ratio: float = key(
        0.0, "WarmupCosineLR: the first rate over model.optim.lr.", by=APP, ge=0.0, status=Status.EXTENSION, note=_DS
    )
    cos_min_ratio: float = key(
        0.0001, "WarmupCosineLR: the last rate over model.optim.lr.", by=APP, ge=0.0, status=Status.EXTENSION, note=_DS
    )
    cycle_min_lr: float | None = key(
        None, "OneCycle: the low rate (required).", by=APP, ge=0.0, status=Status.EXTENSION, note=_DS
    )
    cycle_max_lr: float | None = key(
        None, "OneCycle: the high rate (required).", by=APP, ge=0.0, status=Status.EXTENSION, note=_DS
    )
    decay_lr_rate: float = key(
        0.0,
        "OneCycle: after the cycle, cycle_min_lr / (1 + rate x intervals).",
        by=APP,
        status=Status.EXTENSION,
        note=_DS,
    )
    cycle_first_step_size: int = key(
        2000, "OneCycle: steps of the rise.", by=APP, ge=1, status=Status.EXTENSION, note=_DS
    )
    cycle_second_step_size: int | None = key(
        None,
        "OneCycle: steps of the fall; null: cycle_first_step_size.",
        by=APP,
        ge=1,
        status=Status.EXTENSION,
        note=_DS,
    )
    cycle_first_stair_count: int = key(
        0,
        "OneCycle: accepted as DeepSpeed accepts it; its OneCycle never reads it, so the cycle is continuous.",
        by=APP,
        status=Status.EXTENSION,
        note=_DS,
    )
    cycle_second_stair_count: int | None = key(
        None, "As cycle_first_stair_count.", by=APP, status=Status.EXTENSION, note=_DS
    )
    decay_step_size: int = key(
        0,
        "OneCycle: steps per decay interval after the cycle; 0: no decay.",
        by=APP,
        ge=0,
        status=Status.EXTENSION,
        note=_DS,
    )
    cycle_momentum: bool = key(
        True, "OneCycle: cycle Adam's betas[0] inversely to the rate.", by=APP, status=Status.EXTENSION, note=_DS
    )
    cycle_min_mom: float = key(
        0.8, "OneCycle: the low betas[0] (also the first step's).", by=APP, status=Status.EXTENSION, note=_DS
    )
    cycle_max_mom: float = key(0.9, "OneCycle: the high betas[0].", by=APP, status=Status.EXTENSION, note=_DS)
    decay_mom_rate: float = key(
        0.0,
        "OneCycle: after the cycle, cycle_max_mom x (1 + rate x intervals).",
        by=APP,
        status=Status.EXTENSION,
        note=_DS,
    )
    lr_range_test_min_lr: float = key(
        0.001, "LRRangeTest: the first rate.", by=APP, ge=0.0, status=Status.EXTENSION, note=_DS
    )
    lr_range_test_step_size: int = key(
        2000, "LRRangeTest: steps per interval.", by=APP, ge=1, status=Status.EXTENSION, note=_DS
    )
    lr_range_test_step_rate: float = key(
        1.0, "LRRangeTest: growth per interval.", by=APP, status=Status.EXTENSION, note=_DS
    )
    lr_range_test_staircase: bool = key(
        False, "LRRangeTest: grow in whole intervals.", by=APP, status=Status.EXTENSION, note=_DS
    )

    @model_validator(mode="after")
    def _required(self) -> DeepSpeedSchedule:
        needed = {
            "WarmupDecayLR": ("total_num_steps",),
            "WarmupCosineLR": ("total_num_steps",),
            "OneCycle": ("cycle_min_lr", "cycle_max_lr"),
        }.get(self.type, ())
        if missing := [name for name in needed if getattr(self, name) is None]:
            raise ValueError(f"{self.type} needs {', '.join(missing)}; found nothing")
        warmup = max(2, self.warmup_num_steps)
        if self.type == "WarmupCosineLR" and self.total_num_steps <= warmup:
            raise ValueError(
                f"WarmupCosineLR decays from warmup_num_steps ({warmup}, at least 2) to total_num_steps; "
                f"expected total_num_steps above it, found {self.total_num_steps}"
            )
        return self


class StepLR(Section):
    name: Literal["StepLR"]
    step_size: int = key(..., "Multiply the learning rate by gamma every step_size steps.", by=APP, ge=1)
    gamma: float = key(0.1, "Decay factor.", by=APP, gt=0.0)


class ExponentialLR(Section):
    name: Literal["ExponentialLR"]
    gamma: float = key(0.9, "Multiply the learning rate by gamma every step.", by=APP, gt=0.0)


SCHEDULER_NAMES = (
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


def _reject_rprop_scheduler(value: Any) -> Any:
    if isinstance(value, dict) and value.get("name") == "rprop":
        raise ValueError(
            "expected a scheduler name, found 'rprop' (the reference lists it among schedulers, "
            "but Rprop is an optimizer: set model.optim.name: rprop instead)"
        )
    return value


Scheduler = Annotated[
    LinearAnnealingWithWarmUp
    | CosineAnnealing
    | WarmupPolicy
    | WarmupHoldPolicy
    | SquareAnnealing
    | NoamAnnealing
    | WarmupAnnealing
    | StepLR
    | ExponentialLR
    | NeoXAnnealing
    | TransformersSchedule
    | DeepSpeedSchedule,
    Field(discriminator="name"),
    BeforeValidator(_reject_rprop_scheduler),
]

# --------------------------------------------------------------------------- optimizers


class _LearningRate(Section):
    lr: float = key(..., "Peak learning rate.", by=APP, ge=0.0)
    sched: Scheduler | None = key(None, "Learning-rate schedule; null keeps lr constant.", by=APP)


class _Optimizer(_LearningRate):
    weight_decay: float = key(0.0, "Weight decay (decoupled for AdamW variants).", by=APP, ge=0.0)


_CAPTURABLE = "torch's capturable optimizer step (state on the device, for CUDA graphs)."


class _Capturable(_Optimizer):
    capturable: bool = key(False, _CAPTURABLE, by=APP)


class _AdamFamily(_Capturable):
    betas: _Betas = key((0.9, 0.999), "Coefficients of the running averages of the gradient and its square.", by=APP)
    eps: float = key(1e-8, "Term added to the denominator for stability.", by=APP, gt=0.0)
    amsgrad: bool = key(False, "Use the AMSGrad variant.", by=APP)


class AdamW(_AdamFamily):
    name: Literal["adamw"]


class AdamWFp32OptState(_AdamFamily):
    name: Literal["adamw_fp32OptState"]


class Adam(_AdamFamily):
    name: Literal["adam"]


class Adamax(_Capturable):
    name: Literal["adamax"]
    betas: _Betas = key((0.9, 0.999), "Coefficients of the running averages.", by=APP)
    eps: float = key(1e-8, "Term added to the denominator for stability.", by=APP, gt=0.0)


class SGD(_Optimizer):
    name: Literal["sgd"]
    momentum: float = key(0.0, "Momentum factor.", by=APP, ge=0.0)
    dampening: float = key(0.0, "Dampening for momentum.", by=APP, ge=0.0)
    nesterov: bool = key(False, "Nesterov momentum.", by=APP)


class Adadelta(_Capturable):
    name: Literal["adadelta"]
    rho: float = key(0.9, "Coefficient of the running average of squared gradients.", by=APP, ge=0.0, le=1.0)
    eps: float = key(1e-6, "Term added to the denominator for stability.", by=APP, gt=0.0)


class Adagrad(_Optimizer):
    name: Literal["adagrad"]
    lr_decay: float = key(0.0, "Learning-rate decay.", by=APP, ge=0.0)
    initial_accumulator_value: float = key(0.0, "Initial value of the sum of squares.", by=APP, ge=0.0)
    eps: float = key(1e-10, "Term added to the denominator for stability.", by=APP, gt=0.0)


class RMSprop(_Capturable):
    name: Literal["rmsprop"]
    alpha: float = key(0.99, "Smoothing constant.", by=APP, ge=0.0, le=1.0)
    eps: float = key(1e-8, "Term added to the denominator for stability.", by=APP, gt=0.0)
    momentum: float = key(0.0, "Momentum factor.", by=APP, ge=0.0)
    centered: bool = key(False, "Normalise by an estimate of the gradient's variance.", by=APP)


class Rprop(_LearningRate):
    """Rprop adapts each step size from gradient signs alone: it takes no weight decay."""

    name: Literal["rprop"]
    capturable: bool = key(False, _CAPTURABLE, by=APP)
    etas: _Pair = key((0.5, 1.2), "Multiplicative decrease and increase factors.", by=APP)
    step_sizes: _Pair = key((1e-6, 50.0), "Minimal and maximal step sizes.", by=APP)


class Novograd(_Optimizer):
    name: Literal["novograd"]
    betas: _Betas = key((0.95, 0.98), "Coefficients of the running averages.", by=APP)
    eps: float = key(1e-8, "Term added to the denominator for stability.", by=APP, gt=0.0)
    grad_averaging: bool = key(False, "Scale the gradient by (1 - beta1) in the first moment.", by=APP)
    amsgrad: bool = key(False, "Use the AMSGrad variant.", by=APP)
    luc: bool = key(False, "Layer-wise update clipping.", by=APP)
    luc_trust: float = key(1e-3, "Trust ratio of layer-wise update clipping.", by=APP, gt=0.0)
    luc_eps: float = key(1e-8, "Epsilon of layer-wise update clipping.", by=APP, gt=0.0)


class Lion(_Optimizer):
    name: Literal["lion"] = key(
        ...,
        "Lion: the sign of the interpolated momentum is the update.",
        by=APP,
        status=Status.EXTENSION,
        note="GPT-NeoX's optimizer type lion",
    )
    betas: _Betas = key((0.9, 0.99), "Interpolation (update) and running-average (momentum) coefficients.", by=APP)


class MadgradWD(_Optimizer):
    name: Literal["madgrad_wd"] = key(
        ...,
        "MADGRAD with decoupled weight decay, as GPT-NeoX steps it.",
        by=APP,
        status=Status.EXTENSION,
        note="GPT-NeoX's optimizer type madgrad_wd",
    )
    momentum: float = key(0.9, "Momentum towards each step's dual-averaging point.", by=APP, ge=0.0, lt=1.0)
    eps: float = key(1e-6, "Added to the cube root of the sum of squares, and to lr.", by=APP, ge=0.0)


class SM3(_Optimizer):
    name: Literal["sm3"] = key(
        ...,
        "SM3: Adagrad's adaptive rates from one accumulator per tensor axis (memory of "
        "a row and a column, not a matrix).",
        by=APP,
        status=Status.EXTENSION,
        note="GPT-NeoX's optimizer type sm3",
    )
    momentum: float = key(
        0.0, "Weight of the last update mixed into each step's (keeps one more tensor).", by=APP, ge=0.0, lt=1.0
    )
    beta: float = key(
        0.0,
        "0: the accumulators sum squared gradients (SM3-II); above 0: the new square's share is "
        "1 - beta, a running average.",
        by=APP,
        ge=0.0,
        lt=1.0,
    )
    eps: float = key(
        1e-30,
        "Added under the square root (above 0: an entry whose gradient and accumulators are 0 "
        "would otherwise step by 0/0).",
        by=APP,
        gt=0.0,
    )


class Adam8bit(_Optimizer):
    name: Literal["adam8bit"] = key(
        ...,
        "bitsandbytes' 8-bit Adam: both moments kept as 8-bit codes in blocks of 256 "
        "values (a quarter of Adam's state), weight decay decoupled; every layout steps "
        "as one process (pip install nxd-train[bnb]).",
        by=APP,
        status=Status.EXTENSION,
        note="GPT-NeoX's use_bnb_optimizer with optimizer type adam",
    )
    betas: _Betas = key((0.9, 0.999), "Coefficients of the running averages of the gradient and its square.", by=APP)
    eps: float = key(1e-8, "Term added to the denominator for stability.", by=APP, gt=0.0)
    min_8bit_size: int = key(4096, "Tensors of fewer values keep fp32 moments (bitsandbytes' default).", by=APP, ge=0)


class Adafactor(_Optimizer):
    name: Literal["adafactor"]
    lr: float | None = key(None, "Learning rate; null only with relative_step: True.", by=APP, ge=0.0)
    beta1: Annotated[float | None, NoneString] = key(
        None, "First-moment coefficient; null keeps no first moment.", by=APP
    )
    eps: _Pair = key((1e-30, 1e-3), "Regularisation constants for the square gradient and the parameter scale.", by=APP)
    clip_threshold: float = key(1.0, "Threshold of the root-mean-square of the final update.", by=APP, gt=0.0)
    decay_rate: float = key(
        0.8, "Decay exponent c of the squared-gradient average, beta2(t) = 1 - t^-c (-0.8 reads the same).", by=APP
    )
    scale_parameter: bool = key(True, "Scale the learning rate by the root-mean-square of the parameter.", by=APP)
    relative_step: bool = key(False, "Compute a time-dependent learning rate instead of using lr.", by=APP)
    warmup_init: bool = key(False, "Warm the time-dependent learning rate up (needs relative_step).", by=APP)

    @model_validator(mode="after")
    def _lr_or_relative(self) -> Adafactor:
        if self.lr is None and not self.relative_step:
            raise ValueError("expected lr to be set, or relative_step: True, found neither")
        return self


OPTIMIZER_NAMES = (
    "adamw",
    "adamw_fp32OptState",
    "sgd",
    "adam",
    "adadelta",
    "adamax",
    "adagrad",
    "rmsprop",
    "rprop",
    "novograd",
    "adafactor",
    "lion",
    "madgrad_wd",
    "sm3",
    "adam8bit",
)

Optimizer = Annotated[
    AdamW
    | AdamWFp32OptState
    | SGD
    | Adam
    | Adadelta
    | Adamax
    | Adagrad
    | RMSprop
    | Rprop
    | Novograd
    | Adafactor
    | Lion
    | MadgradWD
    | SM3
    | Adam8bit,
    Field(discriminator="name"),
]
