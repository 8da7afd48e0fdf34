"""Supervised fine-tuning with packing in 2 real gloo processes, launched by the nxd-train command, against
one process: tensor + sequence parallel, pipeline (1F1B), context parallel (ring attention over
packed records' document ids) and data parallel with ZeRO-1 and full recomputation log the same training losses, gradient
norms and validation losses within 1e-6; and a run killed with SIGKILL mid-epoch resumes to the
uninterrupted losses and final state."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_checkpoint_resume import final_state, run, run_and_kill_after_step_5, step_losses
from tests.training_runs import assert_identical, read_metrics, run_command, sft_job

OVERRIDES = [
    "trainer.max_steps=4",
    "trainer.log_every_n_steps=1",
    "exp_manager.create_tensorboard_logger=False",
    "data.micro_batch_size=2",
    "data.global_batch_size=8",
    "trainer.val_check_interval=4",
    "trainer.limit_val_batches=2",
    "trainer.gradient_clip_val=0.5",
]
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


@pytest.mark.parametrize(
    "layout", [pytest.param(name, marks=[] if name == "tp2_sp" else [pytest.mark.slow]) for name in LAYOUTS]
)  # pipeline stages and ZeRO-1 with --runslow
def test_packed_sft_in_two_processes_logs_what_one_process_logs(layout, data, one_process, tmp_path):
    result = run_command(
        *OVERRIDES,
        *data,
        *LAYOUTS[layout],
        "trainer.devices=2",
        f"+exp_manager.explicit_log_dir={tmp_path / layout}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(tmp_path / layout)
    for key in ("loss", "grad_norm", "val_loss"):
        expected = [row[key] for row in one_process if key in row]
        found = [row[key] for row in rows if key in row]
        assert len(expected) == len(found) > 0, key
        assert max(abs(a - b) for a, b in zip(expected, found, strict=True)) < 1e-6, (key, expected, found)


@pytest.mark.slow
def test_sft_killed_mid_epoch_resumes_exactly(tmp_path, data):
    """DP2 with ZeRO-1: 10 steps of 8 rows, well inside the first epoch of 100+ packed rows (slow: the default
    suite resumes SFT mid-epoch in one process, tests/train/test_sft.py, and kills pretraining runs)."""
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


LORA = [
    "+model_alignment_strategy.peft.lora_rank=4",
    "+model_alignment_strategy.peft.lora_alpha=8",
    "+model_alignment_strategy.peft.lora_dropout=0.0",
    "+model_alignment_strategy.peft.merge_sharded_lora=True",
    "+model_alignment_strategy.peft.target_modules=[qkv_proj,o_proj,gate_up_proj,down_proj]",
    "+model_alignment_strategy.peft.save_lora_base=True",
    "exp_manager.create_checkpoint_callback=True",
]


@pytest.fixture(scope="module")
def lora_one_process(tmp_path_factory, data) -> Path:
    from tests.training_runs import train_in_process

    log_dir = tmp_path_factory.mktemp("lora_one")
    train_in_process(log_dir, *OVERRIDES, *data, *LORA)
    return log_dir


@pytest.mark.slow  # LoRA over two processes runs by default in the preference test (tp2_sp_lora) and the parity set
@pytest.mark.parametrize("layout", ["tp2_sp", "pp2"])
def test_lora_in_two_processes_logs_and_saves_what_one_process_does(layout, data, lora_one_process, tmp_path):
    """Adapters sharded like their base layers (TP2 + SP) or split by stage (PP2): the same losses and
    gradient norms, and a checkpoint whose peft adapter file holds the same adapter."""
    from safetensors.torch import load_file

    result = run_command(
        *OVERRIDES,
        *data,
        *LORA,
        *LAYOUTS[layout],
        "trainer.devices=2",
        f"+exp_manager.explicit_log_dir={tmp_path / layout}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    expected, found = read_metrics(lora_one_process), read_metrics(tmp_path / layout)
    for key in ("loss", "grad_norm", "val_loss"):
        pairs = list(zip([r[key] for r in expected if key in r], [r[key] for r in found if key in r], strict=True))
        assert pairs and max(abs(a - b) for a, b in pairs) < 1e-6, (key, pairs)
    adapters = [
        load_file(next((log / "checkpoints").glob("*/adapter_model.safetensors")))
        for log in (lora_one_process, tmp_path / layout)
    ]
    assert set(adapters[0]) == set(adapters[1]) and len(adapters[0]) == 28
    assert max((adapters[0][k] - adapters[1][k]).abs().max().item() for k in adapters[0]) < 1e-6
