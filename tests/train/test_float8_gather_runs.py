"""precision.fp8.all_gather in real runs: two ZeRO-3 processes gather their float8 layers' weights as float8
(torchao's emulation on this CPU) and train as one process does with float8, checkpoint, and resume in one process
with its losses; where gloo could not gather a layer, preflight says so."""

from __future__ import annotations

import pytest

from tests.train.test_checkpointing import SAVE, checkpoints
from tests.training_runs import FAST, losses, read_metrics, run_command

FP8 = ["+precision.fp8.emulate=true", "data.micro_batch_size=2", "data.global_batch_size=8", "trainer.max_steps=4",
       *SAVE, "+exp_manager.checkpoint_callback_params.every_n_train_steps=2"]  # fmt: skip


def test_two_zero3_processes_gathering_float8_train_as_one_and_resume_in_one(tmp_path, train_here):
    single = losses(train_here(*FP8))
    result = run_command(*FAST, *FP8, "trainer.devices=2", "distributed_strategy.zero1=True",
                         "+distributed_strategy.zero3=True", "+precision.fp8.all_gather=true",
                         f"+exp_manager.explicit_log_dir={tmp_path / 'zero3'}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    gathered = losses(read_metrics(tmp_path / "zero3"))
    assert max(abs(a - b) for a, b in zip(single, gathered, strict=True)) < 1e-5, (single, gathered)
    resumed = losses(train_here(*FP8, f"+exp_manager.resume_from_checkpoint={checkpoints(tmp_path / 'zero3')[2]}"))
    assert max(abs(a - b) for a, b in zip(resumed, single[2:], strict=True)) < 1e-5, (resumed, single)


def test_a_layer_of_float8_weights_alone_is_refused_on_gloo(tmp_path):
    from nxd_config import load_config
    from nxd_train.cli import default_config_path
    from nxd_train.corpus import default_cache_dir
    from nxd_train.preflight import PreflightError, plan_run

    cfg = load_config(default_config_path(), [
        f"+exp_manager.explicit_log_dir={tmp_path}", "trainer.devices=2", "distributed_strategy.zero1=True",
        "+distributed_strategy.zero3=True", "+precision.fp8.emulate=true", "+precision.fp8.all_gather=true",
        "model.normalization=non_parametric_layernorm"])  # fmt: skip
    with pytest.raises(PreflightError) as caught:
        plan_run(cfg, default_cache_dir())
    assert any(problem.startswith("precision.fp8.all_gather: gloo, the CPU's collectives, cannot gather float8 "
                                  "tensors, and decoder layer model.layers.0 holds no other parameter")
               for problem in caught.value.problems), caught.value.problems  # fmt: skip
