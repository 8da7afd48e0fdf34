"""A disk that fills: before the first metrics row, and during a checkpoint save (plain and background),
the run stops with one line naming the path, the space free and what the save needs, and keeps the
checkpoints already complete. A real full file system: a small tmpfs mounted for the test."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from nxd_ckpt import list_checkpoints
from nxd_train.cli import main

from tests.training_runs import FAST


@pytest.fixture
def small_disk(tmp_path):
    """Mount a tmpfs of the size asked for under tmp_path; unmounted after the test."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)], capture_output=True, text=True
        )
        if result.returncode != 0:
            pytest.skip(f"a tmpfs cannot be mounted here ({result.stderr.strip()})")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "--lazy", str(point)], check=False)  # files a failed run left open


def test_a_disk_full_before_the_first_metrics_row_is_one_line(small_disk, capsys):
    log_dir = small_disk("12k") / "run"
    assert main([*FAST, "trainer.max_steps=2", f"+exp_manager.explicit_log_dir={log_dir}"]) == 1
    err = capsys.readouterr().err
    assert f"{log_dir}: the disk is full (" in err and "expected room for the run's logs" in err
    assert "Traceback" not in err and "Logging error" not in err


@pytest.mark.parametrize("background", [False, True], ids=["plain", "async"])
def test_a_disk_full_during_a_save_names_the_space_and_keeps_the_earlier_checkpoint(small_disk, capsys, background):
    log_dir = small_disk("10m") / "run"  # one checkpoint of the tiny model (about 7 MiB) fits, two do not
    assert (
        main(
            [
                *FAST,
                "trainer.max_steps=2",
                "exp_manager.create_checkpoint_callback=True",
                "+exp_manager.checkpoint_callback_params.every_n_train_steps=1",
                "+exp_manager.checkpoint_callback_params.save_top_k=-1",
                f"+exp_manager.async_checkpointing={background}",
                f"+exp_manager.explicit_log_dir={log_dir}",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "step=2-consumed_samples=16: the " in err and "save failed: the disk is full (" in err
    assert "MiB free at" in err and "this rank's share of the checkpoint needs about 7.1 MiB" in err
    assert "Traceback" not in err and "enforce fail" not in err
    assert [info.step for info in list_checkpoints(log_dir / "checkpoints") if info.complete] == [1]
    assert not [path for path in (log_dir / "checkpoints").iterdir() if path.name.endswith(".partial")]
