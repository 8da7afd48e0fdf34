"""Pipeline parallel (1F1B, 2 stages) and context parallel (ring attention, 2 parts of each sequence)
through the nxd-train command, 2 gloo processes each, against one process: the training losses, the
logged gradient and parameter norms (summed over the stages), the gradient and optimizer-state statistics
and the validation loss."""

from __future__ import annotations

import pytest

from tests.train.test_training_statistics import STATISTICS, assert_same_statistics
from tests.training_runs import read_metrics, run_command

OVERRIDES = [
    "trainer.max_steps=4",
    "trainer.log_every_n_steps=1",
    "exp_manager.create_tensorboard_logger=False",
    "data.micro_batch_size=2",
    "data.global_batch_size=8",
    "trainer.val_check_interval=4",
    "trainer.limit_val_batches=2",
    "trainer.gradient_clip_val=0.5",
    "+exp_manager.log_parameter_norm=True",
    *STATISTICS,
]
LAYOUTS = {
    "pp2": ["distributed_strategy.pipeline_model_parallel_size=2"],
    "cp2": ["distributed_strategy.context_parallel_size=2", "+model.fusions.ring_attention=True"],
}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> list[dict[str, float]]:
    from tests.training_runs import train_in_process

    return train_in_process(tmp_path_factory.mktemp("one"), *OVERRIDES)


@pytest.mark.parametrize(
    "layout", [pytest.param(name, marks=[] if name == "pp2" else [pytest.mark.slow]) for name in LAYOUTS]
)  # cp2 in test_parity's default scenarios
def test_two_processes_log_what_one_process_logs(layout, one_process, tmp_path):
    result = run_command(
        *OVERRIDES,
        *LAYOUTS[layout],
        "trainer.devices=2",
        f"+exp_manager.explicit_log_dir={tmp_path / layout}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"({layout[:2]} 2)" in result.stdout + result.stderr
    rows = read_metrics(tmp_path / layout)
    for key in ("loss", "grad_norm", "param_norm", "val_loss"):
        expected = [row[key] for row in one_process if key in row]
        found = [row[key] for row in rows if key in row]
        assert len(expected) == len(found) > 0, key
        assert max(abs(a - b) for a, b in zip(expected, found, strict=True)) < 1e-6, (key, expected, found)
    print(
        layout,
        assert_same_statistics([row for row in one_process if "loss" in row], [row for row in rows if "loss" in row]),
    )  # every stage's, gathered
