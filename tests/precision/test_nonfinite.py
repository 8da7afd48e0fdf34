"""The non-finite policy on its own: which steps are skipped, when the run stops, the zero-gradient warning."""

from __future__ import annotations

import math

import pytest
from nxd_precision import NonFiniteGuard, NonFiniteStop, PrecisionConfigError


def test_skips_each_non_finite_step_and_stops_after_the_streak_limit():
    guard = NonFiniteGuard("skip", max_consecutive=3)
    assert guard.check(1, 2.0, 1.0) is False
    assert guard.check(2, math.nan, 1.0) is True
    assert guard.check(3, 2.0, math.inf) is True
    assert guard.check(4, 2.0, 1.0) is False  # the streak ends; the count stays
    assert (guard.skipped, guard.streak) == (2, 0)
    assert guard.check(5, -math.inf, 1.0) and guard.check(6, math.nan, math.nan)
    with pytest.raises(NonFiniteStop, match=r"steps 5 to 7: 3 steps in a row .*max_consecutive_nonfinite: 3"):
        guard.check(7, math.nan, 1.0)


def test_stop_policy_stops_at_the_first_non_finite_step():
    guard = NonFiniteGuard("stop")
    assert guard.check(1, 2.0, 1.0) is False
    with pytest.raises(NonFiniteStop, match=r"step 2: loss nan, gradient norm 1.0; stopping \(trainer.on_nonfinite"):
        guard.check(2, math.nan, 1.0)


def test_an_unknown_policy_is_named():
    with pytest.raises(PrecisionConfigError, match="trainer.on_nonfinite: expected one of skip, stop, found 'ignore'"):
        NonFiniteGuard("ignore")


def test_zero_gradients_warn_once_per_run_of_ten_steps():
    guard = NonFiniteGuard()
    warnings = [guard.zero_gradient_warning(step, 0.0) for step in range(1, 26)]
    assert [step for step, warning in enumerate(warnings, start=1) if warning] == [10]
    assert "exactly 0 for 10 steps up to step 10" in warnings[9]
    assert guard.zero_gradient_warning(26, 0.5) is None
    assert [guard.zero_gradient_warning(step, 0.0) for step in range(27, 37)][-1] is not None
