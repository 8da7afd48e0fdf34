"""fp16 training with loss scaling, end to end on the tiny config: the scales and skipped steps a run logs follow
DeepSpeed's rule for the overflows it met, a resumed run continues with the same scale and losses, and a scale
that cannot take its overflows stops the run with one message."""

from __future__ import annotations

import math

import pytest
from nxd_precision import NonFiniteStop

from tests.training_runs import losses

FP16 = ["precision.type=fp16", "trainer.max_steps=8", "trainer.log_every_n_steps=1"]


def deepspeed_scales(initial: float, window: int, hysteresis: int, floor: float, overflows: list[bool]) -> list[float]:
    """The scale of each step under DeepSpeed's DynamicLossScaler.update_scale, written out here."""
    scale, left, last, used = initial, hysteresis, -1, []
    for step, overflow in enumerate(overflows):
        used.append(scale)
        if overflow:
            if left == 1:
                scale = max(scale / 2, floor)
            else:
                left -= 1
            last = step
        elif (step - last) % window == 0:
            left, scale = hysteresis, scale * 2
    return used


def test_fp16_logs_the_scales_and_skipped_steps_of_deepspeeds_rule(train_here):
    """2^22 overflows fp16 gradients at first: the run halves its way down, skipping those steps, then trains."""
    rows = [
        row
        for row in train_here(
            *FP16,
            "trainer.max_steps=12",
            "+precision.initial_scale_power=22",
            "+precision.hysteresis=1",
            "+precision.loss_scale_window=3",
        )
        if "loss" in row
    ]
    overflows = [not math.isfinite(row["grad_norm"]) for row in rows]
    assert any(overflows) and not all(overflows)
    assert [row["loss_scale"] for row in rows] == deepspeed_scales(2.0**22, 3, 1, 1.0, overflows)
    assert rows[-1]["skipped_steps"] == sum(overflows)
    assert all(math.isfinite(row["loss"]) for row in rows)


def test_a_resumed_fp16_run_continues_with_the_same_scale_and_losses(tmp_path, train_here):
    settings = [
        *FP16,
        "+precision.initial_scale_power=12",
        "+precision.loss_scale_window=2",
        "exp_manager.create_checkpoint_callback=True",
        "+exp_manager.checkpoint_callback_params.every_n_train_steps=4",
        "+exp_manager.checkpoint_callback_params.save_top_k=-1",
    ]
    whole = [row for row in train_here(*settings) if "loss" in row]
    (run,) = [path for path in tmp_path.iterdir() if path.name == "run0"]
    (step_4,) = (run / "checkpoints").glob("*step=4*")
    resumed = [row for row in train_here(*settings, f"+exp_manager.resume_from_checkpoint={step_4}") if "loss" in row]
    assert losses(resumed) == losses(whole)[4:]
    assert [row["loss_scale"] for row in resumed] == [row["loss_scale"] for row in whole][4:]
    assert whole[3]["loss_scale"] < whole[4]["loss_scale"]  # the scale grew across the checkpoint


@pytest.mark.parametrize(
    ("scaling", "cause"),
    [
        (["+precision.loss_scale=1.0e30"], "the static fp16 loss scale precision.loss_scale 1e+30 overflows"),
        (
            ["+precision.initial_scale_power=100", "+precision.min_loss_scale=1.0e29", "+precision.hysteresis=1"],
            "the fp16 loss scale is at its floor, precision.min_loss_scale 1e+29",
        ),
    ],
)
def test_a_scale_that_cannot_take_its_overflows_stops_the_run(train_here, scaling, cause):
    with pytest.raises(NonFiniteStop) as caught:
        train_here(*FP16, *scaling, "+trainer.max_consecutive_nonfinite=3")
    assert "3 steps in a row had a non-finite loss or gradient norm" in str(caught.value)
    assert cause in str(caught.value)


def test_fp16_autocast_computes_in_fp16_over_fp32_weights(train_here):
    """apex's O1 (precision.type fp16_autocast): fp16 compute under torch.autocast with loss scaling, fp32 weights;
    its losses follow fp32's to fp16's precision, and differ from bf16 autocast's (bf16 holds 3 fewer bits)."""
    job = ["trainer.max_steps=4", "trainer.log_every_n_steps=1"]
    fp32 = losses(train_here(*job))
    rows = [row for row in train_here(*job, "precision.type=fp16_autocast") if "loss" in row]
    bf16 = losses(train_here(*job, "precision.type=autocast"))
    fp16 = [row["loss"] for row in rows]
    assert [row["loss_scale"] for row in rows] == [2.0**16] * 4  # DeepSpeed's rule from 2^16, no overflow
    fp16_error = max(abs(a - b) for a, b in zip(fp16, fp32, strict=True))
    bf16_error = max(abs(a - b) for a, b in zip(bf16, fp32, strict=True))
    assert 0 < fp16_error < 5e-3 and fp16_error < bf16_error, (fp16_error, bf16_error)
