"""Non-finite steps in real runs: a diverged run stops with a message and writes no checkpoint after its
first non-finite step; one poisoned step is skipped and training goes on finite; zero gradients warn."""

from __future__ import annotations

import math

import pytest
from nxd_align import TokenObjective
from nxd_ckpt import list_checkpoints
from nxd_precision import NonFiniteStop

from tests.training_runs import losses

SAVE_EVERY_STEP = [
    "exp_manager.create_checkpoint_callback=True",
    "+exp_manager.checkpoint_callback_params.every_n_train_steps=1",
    "+exp_manager.checkpoint_callback_params.save_top_k=-1",
]


def test_a_diverging_run_skips_then_stops_and_saves_nothing_after_the_first_non_finite_step(train_here, tmp_path):
    with pytest.raises(NonFiniteStop, match=r"4 steps in a row had a non-finite loss or gradient norm") as stop:
        train_here(
            "model.optim.lr=1e6", "trainer.max_steps=30", "+trainer.max_consecutive_nonfinite=4", *SAVE_EVERY_STEP
        )
    first = int(str(stop.value).split("steps ")[1].split(" to ")[0])
    saved = sorted(info.step for info in list_checkpoints(tmp_path / "run0" / "checkpoints") if info.complete)
    assert saved and max(saved) == first - 1  # every finite step saved, none from the first non-finite one on


def test_the_stop_policy_stops_at_the_first_non_finite_step(train_here):
    with pytest.raises(NonFiniteStop, match=r"stopping \(trainer.on_nonfinite: stop\)"):
        train_here("model.optim.lr=1e6", "trainer.max_steps=30", "+trainer.on_nonfinite=stop")


def test_one_poisoned_step_is_skipped_and_training_goes_on_finite(train_here, monkeypatch):
    """Step 3's micro-batches give a NaN loss: no update and no learning-rate step (step 4 runs at step
    3's rate), the count logged; every later step is finite, and so are the weights."""
    import nxd_train.run.loop as loop

    clean = train_here("trainer.max_steps=5", "model.optim.sched.warmup_steps=2")
    poisoned_step = {"now": 0}
    train_step, loss = loop.train_step, TokenObjective.loss

    def step_of(run, batches, guard, step):
        poisoned_step["now"] = step
        return train_step(run, batches, guard, step)

    def poisoned(self, logits, batch):
        value, metrics = loss(self, logits, batch)
        return (value * math.nan if poisoned_step["now"] == 3 else value), metrics

    monkeypatch.setattr(loop, "train_step", step_of)
    monkeypatch.setattr(TokenObjective, "loss", poisoned)
    rows = train_here("trainer.max_steps=5", "model.optim.sched.warmup_steps=2", "+exp_manager.log_parameter_norm=True")
    found = losses(rows)
    assert found[:2] == losses(clean)[:2] and math.isnan(found[2])
    assert all(math.isfinite(value) for value in found[3:])
    assert [row.get("skipped_steps") for row in rows if "loss" in row] == [None, None, 1.0, 1.0, 1.0]
    lrs = [row["lr"] for row in rows if "lr" in row]
    assert lrs[3] == lrs[2] == [row["lr"] for row in clean if "lr" in row][2]  # the schedule did not advance
    norms = [row["param_norm"] for row in rows if "param_norm" in row]
    assert len(norms) == 5 and all(math.isfinite(norm) for norm in norms) and norms[2] == norms[1]  # not moved


def test_gradients_stuck_at_zero_are_warned_about(train_here, capsys):
    train_here("model.init_method_std=1e6", "trainer.max_steps=11")
    assert "the gradient norm has been exactly 0 for 10 steps up to step 10" in capsys.readouterr().out
