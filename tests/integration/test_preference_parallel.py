"""ORPO in 2 real gloo processes, launched by the nxd-train command, against one process: tensor +
sequence parallel, pipeline (1F1B, pairs kept in one micro-batch) and data parallel with ZeRO-1 and
full recomputation log the same losses, gradient norms, validation losses and ORPO parts within 1e-6."""

from __future__ import annotations

import pytest

from tests.integration.test_sft_parallel import LAYOUTS
from tests.training_runs import orpo_job, read_metrics, run_command

OVERRIDES = ["trainer.max_steps=4", "trainer.log_every_n_steps=1", "exp_manager.create_tensorboard_logger=False",
             "data.micro_batch_size=2", "data.global_batch_size=8", "trainer.val_check_interval=4",
             "trainer.limit_val_batches=2", "trainer.gradient_clip_val=0.5"]  # fmt: skip
COMPARED = ("loss", "grad_norm", "val_loss", "nll_loss", "log_odds_ratio", "rewards/margins", "logps/rejected")


@pytest.fixture(scope="module")
def data(tmp_path_factory, chat_tokenizer_dir) -> list[str]:
    return orpo_job(tmp_path_factory.mktemp("orpo_data"), chat_tokenizer_dir)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, data) -> list[dict[str, float]]:
    from tests.training_runs import train_in_process

    return train_in_process(tmp_path_factory.mktemp("one"), *OVERRIDES, *data)


@pytest.mark.parametrize("layout", ["tp2_sp", "pp2", "dp2_zero1_recompute"])
def test_orpo_in_two_processes_logs_what_one_process_logs(layout, data, one_process, tmp_path):
    result = run_command(*OVERRIDES, *data, *LAYOUTS[layout], "trainer.devices=2",
                         f"+exp_manager.explicit_log_dir={tmp_path / layout}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(tmp_path / layout)
    for key in COMPARED:
        expected = [row[key] for row in one_process if key in row]
        found = [row[key] for row in rows if key in row]
        assert len(expected) == len(found) > 0, key
        assert max(abs(a - b) for a, b in zip(expected, found, strict=True)) < 1e-6, (key, expected, found)
