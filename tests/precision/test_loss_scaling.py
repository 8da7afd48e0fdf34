"""fp16 loss scaling against DeepSpeed's DynamicLossScaler rule worked by hand: the scale each step uses and
which overflows are skipped, for a sequence of overflows; static scales; state kept across a checkpoint."""

from __future__ import annotations

import pytest
import torch
from nxd_precision import LossScaler, LossScaling, PrecisionConfigError

X, C = True, False  # an overflowing step, a clean one


def _run(settings: LossScaling, overflows: list[bool]) -> tuple[list[float], list[bool]]:
    scaler = LossScaler(settings)
    scales, skipped = [], []
    for overflow in overflows:
        scales.append(scaler.scale)
        skipped.append(scaler.update(overflow))
    return scales, skipped


def test_dynamic_scaling_follows_deepspeeds_rule():
    """initial 2^4 = 16, window 3, hysteresis 2, floor 2. By hand (i = step from 0, last overflow from -1):
    i0 C: (0+1) % 3 != 0 -> 16;  i1 C: 2 % 3 -> 16;  i2 C: 3 % 3 == 0 -> doubles to 32, hysteresis 2
    i3 X: hysteresis 2 -> 1, scale stays 32 (last overflow 3);  i4 X: hysteresis 1 -> halves to 16
    i5 X: halves to 8;  i6 X: halves to 4;  i7 X: halves to 2 (the floor)
    i8 C: (8-7) % 3;  i9 C: 2;  i10 C: 3 % 3 == 0 -> doubles to 4, hysteresis back to 2
    i11 X: hysteresis 2 -> 1 (4 stays);  i12 X: halves to 2;  i13 X: at the floor, hysteresis spent: not taken."""
    settings = LossScaling(initial_scale_power=4, loss_scale_window=3, hysteresis=2, min_loss_scale=2)
    flags = [C, C, C, X, X, X, X, X, C, C, C, X, X, X]
    scales, skipped = _run(settings, flags)
    assert scales == [16, 16, 16, 32, 32, 16, 8, 4, 2, 2, 2, 4, 4, 2]
    assert skipped == [False, False, False, True, True, True, True, True, False, False, False, True, True, False]


def test_consecutive_hysteresis_restores_it_after_each_clean_step():
    """hysteresis 2: X absorbs (2 -> 1), C restores it to 2, X absorbs again: the scale never halves."""
    settings = LossScaling(initial_scale_power=4, loss_scale_window=100, hysteresis=2, consecutive_hysteresis=True)
    scales, skipped = _run(settings, [X, C, X, C, X, X])
    assert scales == [16, 16, 16, 16, 16, 16] and skipped == [True, False, True, False, True, True]
    assert _run(LossScaling(initial_scale_power=4, loss_scale_window=100, hysteresis=2), [X, C, X])[0] == [16, 16, 16]
    assert _run(LossScaling(initial_scale_power=4, loss_scale_window=100, hysteresis=2), [X, C, X, C])[0][3] == 8


def test_a_static_scale_never_changes_and_takes_no_overflow():
    scales, skipped = _run(LossScaling(loss_scale=128), [C, X, C, X])
    assert scales == [128, 128, 128, 128] and skipped == [False] * 4  # overflows go to the non-finite policy


def test_gradients_are_divided_by_the_scale():
    scaler = LossScaler(LossScaling(initial_scale_power=3))
    weight = torch.zeros(3, requires_grad=True)
    weight.grad = torch.tensor([8.0, -16.0, float("inf")])
    scaler.unscale_([weight])
    assert weight.grad.tolist() == [1.0, -2.0, float("inf")]


def test_the_state_continues_after_a_checkpoint():
    settings = LossScaling(initial_scale_power=4, loss_scale_window=3, hysteresis=2, min_loss_scale=2)
    flags = [C, C, C, X, X, X, C, C, C, C]
    whole, _ = _run(settings, flags)
    first = LossScaler(settings)
    for flag in flags[:5]:
        first.update(flag)
    second = LossScaler(settings)
    second.load_state_dict(first.state_dict())
    rest = []
    for flag in flags[5:]:
        rest.append(second.scale)
        second.update(flag)
    assert rest == whole[5:] and second.skipped == 3


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(loss_scale=-1), "precision.loss_scale: expected 0 (dynamic) or a positive scale, found -1"),
        (dict(hysteresis=0), "precision.hysteresis: expected at least 1 overflow, found 0"),
        (
            dict(loss_scale_window=0, min_loss_scale=0),
            "precision.loss_scale_window: expected at least 1 step, found 0; "
            "precision.min_loss_scale: expected a positive scale, found 0",
        ),
    ],
)
def test_settings_out_of_range_are_named(settings, message):
    with pytest.raises(PrecisionConfigError) as caught:
        LossScaling(**settings)
    assert str(caught.value) == message
