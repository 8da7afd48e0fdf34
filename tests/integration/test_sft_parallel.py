"""Supervised fine-tuning with packing in 2 real gloo processes, launched by the nxd-train command, against
one process: tensor + sequence parallel, pipeline (1F1B), context parallel (ring attention over
packed records' document ids) and data parallel with ZeRO-1 and full recomputation log the same training losses, gradient
norms and validation losses within 1e-6; and a run killed with SIGKILL mid-epoch resumes to the
uninterrupted losses and final state."""

from __future__ import annotations

import pytest

from tests.integration.test_checkpoint_resume import final_state, run, run_and_kill_after_step_5, step_losses
from tests.training_runs import assert_identical, read_metrics, run_command, sft_job

OVERRIDES = ["trainer.max_steps=4", "trainer.log_every_n_steps=1", "exp_manager.create_tensorboard_logger=False",
             "data.micro_batch_size=2", "data.global_batch_size=8", "trainer.val_check_interval=4",
             "trainer.limit_val_batches=2", "trainer.gradient_clip_val=0.5"]  # fmt: skip
LAYOUTS = {
    "tp2_sp": ["distributed_strategy.tensor_model_parallel_size=2", "distributed_strategy.sequence_parallel=True"],
    "pp2": ["distributed_strategy.pipeline_model_parallel_size=2"],
    "cp2": ["distributed_strategy.context_parallel_size=2", "+model.fusions.ring_attention=True"],
    "dp2_zero1_recompute": ["distributed_strategy.zero1=True", "model.activations_checkpoint_granularity=full"],
}


@pytest.fixture(scope="module")
def data(tmp_path_factory, chat_tokenizer_dir) -> list[str]:
    return sft_job(tmp_path_factory.mktemp("sft_data"), chat_tokenizer_dir)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, data) -> list[dict[str, float]]:
    from tests.training_runs import train_in_process

    return train_in_process(tmp_path_factory.mktemp("one"), *OVERRIDES, *data)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_packed_sft_in_two_processes_logs_what_one_process_logs(layout, data, one_process, tmp_path):
    result = run_command(*OVERRIDES, *data, *LAYOUTS[layout], "trainer.devices=2",
                         f"+exp_manager.explicit_log_dir={tmp_path / layout}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(tmp_path / layout)
    for key in ("loss", "grad_norm", "val_loss"):
        expected = [row[key] for row in one_process if key in row]
        found = [row[key] for row in rows if key in row]
        assert len(expected) == len(found) > 0, key
        assert max(abs(a - b) for a, b in zip(expected, found, strict=True)) < 1e-6, (key, expected, found)


def test_sft_killed_mid_epoch_resumes_exactly(tmp_path, data):
    """DP2 with ZeRO-1: 10 steps of 8 rows, well inside the first epoch of 100+ packed rows."""
    layout = ["trainer.devices=2", "distributed_strategy.zero1=True", *data]
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    whole.mkdir()
    broken.mkdir()
    run(whole / "run", *layout)
    run_and_kill_after_step_5(broken / "run", *layout)
    assert 10 not in step_losses(broken / "run"), "the kill came after the run had finished"
    run(broken / "run", *layout, "exp_manager.resume_if_exists=True")
    expected, resumed = step_losses(whole / "run"), step_losses(broken / "run")
    assert [resumed[step] for step in range(6, 11)] == [expected[step] for step in range(6, 11)]
    assert_identical(final_state(broken / "run"), final_state(whole / "run"))
