"""data.curriculum (GPT-NeoX's curriculum_learning): each step trains on the schedule's length, a resume mid-way
gives the uninterrupted losses, and two context-parallel processes log what one process logs."""

from __future__ import annotations

import pytest
from nxd_config import ConfigError, load_config
from nxd_train.cli import default_config_path

from tests.train.test_checkpointing import SAVE, checkpoints
from tests.training_runs import FAST, read_metrics, run_command

# floor(s / 4 x 48 + 16) for s = 1..4: 28, 40, 52, 64 -> multiples of 16
CURRICULUM = [
    "+data.curriculum.enabled=True",
    "+data.curriculum.min_length=16",
    "+data.curriculum.total_steps=4",
    "+data.curriculum.length_step=16",
]
SCHEDULE = [16, 32, 48, 64, 64, 64]


def test_steps_train_on_the_schedule_and_resume_mid_way(tmp_path, train_here):
    job = ["trainer.max_steps=6", *CURRICULUM, *SAVE, "+exp_manager.checkpoint_callback_params.every_n_train_steps=2"]
    whole = [row for row in train_here(*job) if "loss" in row]
    assert [row["curriculum_seqlen"] for row in whole] == SCHEDULE
    tokens = [row["tokens_per_s"] * row["step_time"] for row in whole]  # a step's tokens: 8 samples x its length
    assert [round(value) for value in tokens] == [8 * length for length in SCHEDULE]
    plain = [row for row in train_here("trainer.max_steps=1") if "loss" in row]
    assert abs(plain[0]["loss"] - whole[0]["loss"]) > 1e-3  # the first step read 16 of 64 tokens
    resumed = [
        row
        for row in train_here(*job, f"+exp_manager.resume_from_checkpoint={checkpoints(tmp_path / 'run0')[2]}")
        if "loss" in row
    ]
    assert [row["loss"] for row in resumed] == [row["loss"] for row in whole[2:]]
    assert [row["curriculum_seqlen"] for row in resumed] == SCHEDULE[2:]


@pytest.mark.slow  # the single-process resume above stays in the default suite
def test_two_context_parallel_processes_log_what_one_process_logs(tmp_path, train_here):
    job = ["trainer.max_steps=3", "data.micro_batch_size=2", "data.global_batch_size=8", *CURRICULUM]
    single = [row for row in train_here(*job) if "loss" in row]
    result = run_command(
        *FAST,
        *job,
        "trainer.devices=2",
        "distributed_strategy.context_parallel_size=2",
        "+model.fusions.ring_attention=True",
        f"+exp_manager.explicit_log_dir={tmp_path / 'cp2'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    double = [row for row in read_metrics(tmp_path / "cp2") if "loss" in row]
    assert [row["curriculum_seqlen"] for row in double] == SCHEDULE[:3]
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(single, double, strict=True)) < 1e-6


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["distributed_strategy.pipeline_model_parallel_size=2"], "pipeline stages exchange activations of one fixed"),
        (
            [
                "+data.curriculum.length_step=10",
                "+data.curriculum.min_length=10",
                "distributed_strategy.context_parallel_size=2",
                "+model.fusions.ring_attention=True",
            ],
            "a multiple of 4: tensor parallel with sequence_parallel, 2 x context parallel); found 10",
        ),
        (["+data.curriculum.min_length=4"], "expected at least length_step (8)"),
        (
            [
                "+data.curriculum.schedule=fixed_discrete",
                "+data.curriculum.lengths=[8,64]",
                "+data.curriculum.max_steps=[]",
            ],
            "expected one fewer max_steps than lengths",
        ),
        (["+data.curriculum.max_length=128"], "expected at most the sequence length (64), found 128"),
    ],
)
def test_curricula_that_cannot_run_are_refused_by_name(overrides, message):
    with pytest.raises(ConfigError) as caught:
        load_config(default_config_path(), ["+data.curriculum.enabled=True", "trainer.devices=2", *overrides])
    assert "data.curriculum" in str(caught.value) and message in str(caught.value)


def test_fine_tuning_records_are_not_cut_nor_counted_in_characters():
    sft = default_config_path().with_name("tiny_sft.yaml")
    for override, message in (
        ("+data.curriculum.enabled=True", "data.curriculum: cuts pretraining samples"),
        ("+trainer.char_level_ppl=True", "trainer.char_level_ppl: counts the characters of pretraining samples"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config(sft, [override])
