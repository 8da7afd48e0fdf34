"""The training loop in one process: accumulation parity, epochs, validation cadence, logging, bad input."""

from __future__ import annotations

import pytest
from nxd_config import ConfigNotice, load_config
from nxd_train.checks.preflight import PreflightError, plan_run
from nxd_train.cli import default_config_path
from nxd_train.logging.monitor import Monitor
from nxd_train.run.corpus import default_cache_dir
from nxd_train.run.loop import train
from nxd_train.run.plan import Cadence, batch_limit

from tests.training_runs import hf_run_config, losses, read_metrics, train_in_process


def test_accumulation_4x1_equals_1x4(train_here):
    """Four micro-batches of one sample give the gradients of one micro-batch of four."""
    four_by_one = losses(train_here("trainer.max_steps=5", "data.micro_batch_size=1", "data.global_batch_size=4"))
    one_by_four = losses(train_here("trainer.max_steps=5", "data.micro_batch_size=4", "data.global_batch_size=4"))
    assert len(four_by_one) == 5
    assert max(abs(a - b) for a, b in zip(four_by_one, one_by_four, strict=True)) < 1e-6


def test_a_chunked_loss_trains_as_whole_logits_do(train_here):
    """model.fusions.loss_chunk_tokens reaches the model: chunks of 50 tokens (uneven over a micro-batch)
    give the losses of whole logits, and the model is planned with that chunk."""
    cfg = load_config(default_config_path(), ["+model.fusions.loss_chunk_tokens=50"])
    assert plan_run(cfg, default_cache_dir()).family.spec.loss_chunk_tokens == 50
    whole = losses(train_here("trainer.max_steps=4"))
    chunked = losses(train_here("trainer.max_steps=4", "+model.fusions.loss_chunk_tokens=50"))
    assert len(chunked) == 4
    assert max(abs(a - b) for a, b in zip(whole, chunked, strict=True)) < 1e-6


def test_epochs_bound_the_run_and_splits_string_sizes_the_data(train_here):
    # the corpus is 105 files; 10/1000 of them rounds to one, a 1,742-token file: (1742 - 1) // 64 = 27
    # samples of one epoch, so 3 whole global batches of 8 per epoch
    overrides = ["trainer.max_steps=-1", "trainer.max_epochs=2", "+data.splits_string='10,985,5'"]
    assert (
        len(
            plan_run(
                load_config(default_config_path(), overrides + ["model.optim.sched.max_steps=6"]), default_cache_dir()
            ).data.train
        )
        == 27
    )
    rows = train_here(*overrides, "model.optim.sched.max_steps=6")
    steps = [row for row in rows if "loss" in row]
    assert len(steps) == 6
    assert [row["epoch"] for row in steps] == [0.0] * 3 + [1.0] * 3
    assert steps[-1]["consumed_samples"] == 6 * 8


def test_validation_and_test_losses_are_logged(train_here):
    rows = train_here(
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        "trainer.limit_val_batches=2",
        "trainer.limit_test_batches=1",
        "+exp_manager.log_parameter_norm=True",
    )
    assert [row["step"] for row in rows if "val_loss" in row] == [2.0, 4.0]
    assert [row["step"] for row in rows if "test_loss" in row] == [4.0]
    # mfu is left out of a step that beats a ceiling measured while the test machine was busy
    assert all(row["param_norm"] > 0 and 0 < row.get("mfu", 0.5) < 1 for row in rows if "loss" in row)


def test_a_step_faster_than_the_measured_ceiling_logs_no_mfu_and_says_why(tmp_path, monkeypatch):
    """A ceiling measured while other work held the cores: MFU is unknown, never 100%."""
    import nxd_train.run.setup as run_module
    from nxd_models import Ceiling

    monkeypatch.setattr(run_module, "device_ceiling", lambda device, dtype: Ceiling(1.0, "cpu: measured", True))
    rows = train_in_process(tmp_path / "run", "trainer.max_steps=2")
    assert [row for row in rows if "loss" in row] and not any("mfu" in row for row in rows)
    log = (tmp_path / "run" / "nxd_log_globalrank-0_localrank-0.txt").read_text()
    assert (
        log.count(
            "MFU unknown from here on where a step beats the ceiling (cpu: measured): it was measured "
            "while other work held the device"
        )
        == 1
    )


@pytest.mark.parametrize(
    ("interval", "every", "expected"),
    [
        (3, None, [2, 5, 8, 11]),
        (2, 1, [1, 3, 6, 8, 11]),
        (1.0, 1, [4, 9]),
        (0.5, 1, [1, 3, 6, 8, 11]),
        (1.0, 2, [9]),
        (5, 2, [9]),
    ],
)
def test_validation_cadence_follows_lightning(interval, every, expected):
    cadence = Cadence(val_check_interval=interval, check_val_every_n_epoch=every)
    steps_per_epoch = 5
    due = [step for step in range(12) if cadence.validation_due(step, *divmod(step, steps_per_epoch), steps_per_epoch)]
    assert due == expected


@pytest.mark.parametrize(
    ("limit", "available", "expected"),
    [(0, 10, 0), (3, 10, 3), (30, 10, 10), (0.25, 10, 2), (1.0, 10, 10), (0.0, 10, 0), (-1, 10, 10)],
)
def test_batch_limits_count_or_fraction(limit, available, expected):
    assert batch_limit(limit, available) == expected


def test_only_local_rank_0_writes_a_log_file_when_asked(tmp_path):
    for local_rank in (0, 1):
        Monitor(
            tmp_path,
            global_rank=local_rank + 2,
            local_rank=local_rank,
            total_steps=1,
            local_rank_0_only=True,
            tensorboard=False,
        ).close()
    assert [p.name for p in tmp_path.iterdir()] == ["nxd_log_globalrank-2_localrank-0.txt"]


def _plan_problems(*overrides: str, source=None) -> str:
    cfg = load_config(source or default_config_path(), list(overrides))
    with pytest.raises(PreflightError) as caught:
        plan_run(cfg, default_cache_dir())
    return str(caught.value)


def test_capturable_on_cpu_is_a_notice_and_changes_no_update(train_here):
    """NxDT's examples set capturable for their devices; on a CPU the step runs uncaptured, as torch's
    capturable=False step, with one notice."""
    with pytest.warns(
        ConfigNotice,
        match="model.optim.capturable: True matters to CUDA graph capture only; this "
        "run's tensors are on cpu, so the step runs uncaptured",
    ):
        captured = train_here("+model.optim.capturable=True", "trainer.max_steps=2")
    plain = train_here("trainer.max_steps=2")
    assert [row["loss"] for row in captured if "loss" in row] == [row["loss"] for row in plain if "loss" in row]


def test_sequence_longer_than_positions_is_rejected_before_launch():
    message = _plan_problems("model.max_position_embeddings=32")
    assert "model.encoder_seq_length: expected at most max_position_embeddings (32), found 64" in message


def test_hf_vocab_smaller_than_the_tokenizer_is_rejected(tmp_path):
    message = _plan_problems(source=hf_run_config(tmp_path, vocab_size=1000))
    assert (
        f"{tmp_path / 'config.json'}: vocab_size: expected at least the tokenizer's 4096 tokens, found 1000" in message
    )


def test_hf_sequence_longer_than_its_positions_is_rejected(tmp_path):
    message = _plan_problems(source=hf_run_config(tmp_path, vocab_size=4096, max_positions=32))
    assert "data.seq_length: expected at most max_position_embeddings (32)" in message


def test_missing_hf_config_file_is_rejected(tmp_path):
    source = hf_run_config(tmp_path, vocab_size=4096)
    (tmp_path / "config.json").unlink()
    assert (
        "model.model_config: expected a config.json file or a directory with one, found no file at"
        in _plan_problems(source=source)
    )


def test_hf_model_trains(tmp_path):
    cfg = load_config(hf_run_config(tmp_path, vocab_size=4096), [f"+exp_manager.explicit_log_dir={tmp_path / 'logs'}"])
    rows = read_metrics(train(plan_run(cfg, default_cache_dir())))
    assert [row["step"] for row in rows if "loss" in row] == [1.0, 2.0, 3.0]


def test_worker_processes_read_the_same_batches(train_here):
    inline = losses(train_here("trainer.max_steps=3"))
    workers = losses(train_here("trainer.max_steps=3", "+data.num_workers=2"))
    assert inline == workers


def test_training_split_smaller_than_a_global_batch_is_rejected():
    message = _plan_problems(
        "trainer.max_steps=-1",
        "trainer.max_epochs=1",
        "model.optim.sched.max_steps=1",
        "+data.splits_string='10,985,5'",
        "data.global_batch_size=32",
    )
    assert "data.global_batch_size: expected at most the 27 samples of the training split, found 32" in message
    message = _plan_problems("+data.splits_string='0,0,1'")
    assert "data.splits_string: '0,0,1' leaves no documents for training" in message


def test_logs_go_to_a_new_version_under_the_experiment_name(tmp_path, monkeypatch):
    """exp_manager.name names the folder under exp_dir (the run's name when unset); versions count up."""
    monkeypatch.chdir(tmp_path)
    overrides = [
        "trainer.max_steps=1",
        "trainer.limit_val_batches=0",
        "exp_manager.create_tensorboard_logger=False",
        f"exp_manager.exp_dir={tmp_path / 'logs'}",
        "exp_manager.name=experiment",
    ]
    for _ in range(2):
        cfg = load_config(default_config_path(), overrides)
        train(plan_run(cfg, default_cache_dir()))
    assert sorted(p.name for p in (tmp_path / "logs" / "experiment").iterdir()) == ["version_0", "version_1"]
