"""What a step whose loss or gradient norm is NaN or infinite does to the run.

A non-finite step must never reach the weights: its update would poison every later step and every
checkpoint after it. As mixed-precision loss scaling does, the step is skipped (no optimizer update,
no learning-rate step) and training goes on with the next batch; a streak of skipped steps means the
run has diverged, so it stops with a message rather than spin. The other policy stops at the first
one. Gradients that are exactly zero step after step are not an error, but almost always a broken
run (a dead initialisation, labels all ignored), so they are warned about once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import PrecisionConfigError

POLICIES = ("skip", "stop")
ZERO_GRADIENT_STEPS = 10
"""Steps in a row with a gradient norm of exactly 0 before the warning."""


class NonFiniteStop(RuntimeError):
    """The run stopped on non-finite values; the message says where and what to look at."""


@dataclass
class NonFiniteGuard:
    policy: str = "skip"
    max_consecutive: int = 10
    skipped: int = 0
    """Steps skipped so far in this run."""
    streak: int = 0
    """Steps skipped in a row, up to the latest one."""
    _first_of_streak: int | None = None
    _zero_steps: int = 0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise PrecisionConfigError(
                f"trainer.on_nonfinite: expected one of {', '.join(POLICIES)}, found {self.policy!r}"
            )

    def check(self, step: int, loss: float, grad_norm: float, cause: str = "") -> bool:
        """Whether optimizer step `step` (1-based) must be skipped; NonFiniteStop when the run must end. `cause`,
        when given, says what else the step's values show (an fp16 loss scale at its floor)."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.streak, self._first_of_streak = 0, None
            return False
        what = f"loss {loss}, gradient norm {grad_norm}" + (f"; {cause}" if cause else "")
        if self.policy == "stop":
            raise NonFiniteStop(f"step {step}: {what}; stopping (trainer.on_nonfinite: stop). {_HINT}")
        self.skipped, self.streak = self.skipped + 1, self.streak + 1
        self._first_of_streak = self._first_of_streak or step
        if self.streak >= self.max_consecutive:
            raise NonFiniteStop(
                f"steps {self._first_of_streak} to {step}: {self.streak} steps in a row had a "
                f"non-finite loss or gradient norm (last: {what}), each skipped without an update; "
                f"stopping (trainer.max_consecutive_nonfinite: {self.max_consecutive}). "
                f"{_HINT}"
            )
        return True

    def zero_gradient_warning(self, step: int, grad_norm: float) -> str | None:
        """A warning when step `step` completes ZERO_GRADIENT_STEPS in a row with a gradient norm of
        exactly 0 (once per such run of steps); None otherwise."""
        self._zero_steps = self._zero_steps + 1 if grad_norm == 0.0 else 0
        if self._zero_steps != ZERO_GRADIENT_STEPS:
            return None
        return (
            f"warning: the gradient norm has been exactly 0 for {ZERO_GRADIENT_STEPS} steps up to step {step}: "
            "nothing trains (look at model.init_method_std, the precision type and whether any label counts)"
        )


_HINT = (
    "The weights hold the last finite update (no checkpoint was written after the first non-finite step); "
    "look at model.optim.lr, model.init_method_std, the precision type and the data."
)
