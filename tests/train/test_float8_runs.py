"""FP8 runs and their preflight: two ZeRO-3 processes gathering their float8 layers' weights as float8 (torchao's
emulation on this CPU) train as one process does, checkpoint, and resume in one process with its losses; preflight
refuses a gather gloo cannot make and a tensor-parallel part torch._scaled_mm cannot take, and keeps replicated
key/value projections in their precision."""

from __future__ import annotations

import pytest

from tests.train.test_checkpointing import SAVE, checkpoints
from tests.training_runs import FAST, losses, read_metrics, run_command

FP8 = [
    "+precision.fp8.emulate=true",
    "data.micro_batch_size=2",
    "data.global_batch_size=8",
    "trainer.max_steps=4",
    *SAVE,
    "+exp_manager.checkpoint_callback_params.every_n_train_steps=2",
]


@pytest.mark.slow  # the default suite's float8 gather under ZeRO-3 in two processes: tests/parallel/test_parity.py
def test_two_zero3_processes_gathering_float8_train_as_one_and_resume_in_one(tmp_path, train_here):
    single = losses(train_here(*FP8))
    result = run_command(
        *FAST,
        *FP8,
        "trainer.devices=2",
        "distributed_strategy.zero1=True",
        "+distributed_strategy.zero3=True",
        "+precision.fp8.all_gather=true",
        f"+exp_manager.explicit_log_dir={tmp_path / 'zero3'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    gathered = losses(read_metrics(tmp_path / "zero3"))
    assert max(abs(a - b) for a, b in zip(single, gathered, strict=True)) < 1e-5, (single, gathered)
    resumed = losses(train_here(*FP8, f"+exp_manager.resume_from_checkpoint={checkpoints(tmp_path / 'zero3')[2]}"))
    assert max(abs(a - b) for a, b in zip(resumed, single[2:], strict=True)) < 1e-5, (resumed, single)


ZERO3_GATHER = ["distributed_strategy.zero1=True", "+distributed_strategy.zero3=True", "+precision.fp8.all_gather=true"]


def _plan(tmp_path, *overrides: str):  # noqa: ANN202
    """nxd-train's plan of the default job on 2 processes with emulated float8 and `overrides`, or its
    PreflightError."""
    from nxd_config import load_config
    from nxd_train.checks.preflight import PreflightError, plan_run
    from nxd_train.cli import default_config_path
    from nxd_train.run.corpus import default_cache_dir

    cfg = load_config(
        default_config_path(),
        [f"+exp_manager.explicit_log_dir={tmp_path}", "trainer.devices=2", "+precision.fp8.emulate=true", *overrides],
    )
    try:
        return plan_run(cfg, default_cache_dir())
    except PreflightError as error:
        return error


def test_the_gather_reaches_the_policy_and_a_layer_of_float8_weights_alone_is_refused_on_gloo(tmp_path, monkeypatch):
    monkeypatch.setattr("nxd_train.checks.preflight.accelerator_name", lambda: "cpu")  # gloo's, on any host
    assert _plan(tmp_path / "gathered", *ZERO3_GATHER).policy.float8.all_gather
    refused = _plan(tmp_path, *ZERO3_GATHER, "model.normalization=non_parametric_layernorm")
    assert any(
        problem.startswith(
            "precision.fp8.all_gather: gloo, the CPU's collectives, cannot gather float8 "
            "tensors, and decoder layer model.layers.0 holds no other parameter"
        )
        for problem in refused.problems
    ), refused.problems


def test_a_tensor_parallel_part_scaled_mm_cannot_take_is_refused(tmp_path):
    """The default model's MLP is 176 wide: under tp 2 each rank's 88 columns are no multiple of 16."""
    problems = _plan(tmp_path, "distributed_strategy.tensor_model_parallel_size=2").problems
    assert (
        "precision.fp8: under tensor parallelism each rank runs model.layers.0.mlp.gate_proj's float8 matmul on "
        "its part of out_features (176 / 2), which torch._scaled_mm needs to be a multiple of 16; expected a "
        "distributed_strategy.tensor_model_parallel_size that leaves it so, found 2" in problems
    ), problems
    wider = _plan(tmp_path / "wider", "distributed_strategy.tensor_model_parallel_size=2", "model.ffn_hidden_size=192")
    assert wider.policy.float8 is not None and not wider.policy.float8.kept


def test_replicated_key_value_projections_keep_their_precision(tmp_path):
    """With a kv_replicator each rank computes only its head rows of the key/value projections (outside the float8
    layer), so the plan keeps them in the parameters' precision in every layout, and says so."""
    with pytest.warns(UserWarning, match="key/value projections a kv_replicator replicates"):
        plan = _plan(
            tmp_path,
            "distributed_strategy.tensor_model_parallel_size=2",
            "model.ffn_hidden_size=192",
            "model.num_kv_heads=1",
            "+distributed_strategy.kv_replicator=2",
        )
    assert plan.policy.float8.kept == ("model.layers.*.self_attn.k_proj", "model.layers.*.self_attn.v_proj")
