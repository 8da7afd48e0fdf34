"""nxd-ckpt in one process: what a checkpoint holds, completion markers, damage, retention, async save."""

from __future__ import annotations

import errno
import json
import os

import pytest
import torch
from nxd_ckpt import (
    MARKER,
    Checkpointer,
    CheckpointError,
    CheckpointWarning,
    SavePolicy,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    read_info,
)
from nxd_ckpt.retention import checkpoint_name


def state(seed: int, rows: int = 4) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(rows, 3, generator=generator), "b": torch.randn(rows, generator=generator)},
        "progress": {"step": seed},
        "note": f"saved at {seed}",
    }


def empty(rows: int = 4) -> dict:
    return {"model": {"w": torch.zeros(rows, 3), "b": torch.zeros(rows)}, "progress": {"step": -1}, "note": None}


def save(checkpointer: Checkpointer, step: int, **metrics: float):
    return checkpointer.save(state(step), step=step, consumed_samples=8 * step, metrics=metrics)


def test_round_trip_and_marker(tmp_path):
    checkpointer = Checkpointer(tmp_path, SavePolicy(filename="run--{step}-{consumed_samples}"))
    path = checkpointer.save(state(3), step=3, consumed_samples=24, metrics={"loss": 2.5}, extra={"world_size": 1})
    assert path.name == "run--step=3-consumed_samples=24"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # the staging folder was renamed
    record = json.loads((path / MARKER).read_text())
    assert record["step"] == 3 and record["consumed_samples"] == 24 and record["metrics"] == {"loss": 2.5}
    assert record["world_size"] == 1
    assert record["files"] == {p.name: p.stat().st_size for p in path.iterdir() if p.name != MARKER}
    loaded = empty()
    info = load_checkpoint(path, loaded)
    assert info.step == 3 and loaded["progress"] == {"step": 3} and loaded["note"] == "saved at 3"
    assert all(torch.equal(loaded["model"][k], state(3)["model"][k]) for k in ("w", "b"))


def test_filename_template_follows_lightning():
    values = {"step": 12, "consumed_samples": 96, "loss": 2.34567}
    assert checkpoint_name("m--{step}-{consumed_samples}", values, set(), True) == "m--step=12-consumed_samples=96"
    assert checkpoint_name("{loss:.2f}-{val_loss}", values, set(), True) == "loss=2.35-val_loss=0"
    taken = {"s-step=12", "s-step=12-v1"}
    assert checkpoint_name("s-{step}", values, taken, True) == "s-step=12-v2"
    assert checkpoint_name("s-{step}", values, taken, False) == "s-step=12"


def test_top_k_by_monitor_keeps_the_best(tmp_path):
    checkpointer = Checkpointer(tmp_path, SavePolicy(save_top_k=2, monitor="loss", mode="min", filename="{step}"))
    for step, loss in ((1, 3.0), (2, 1.0), (3, 2.0), (4, 5.0)):
        save(checkpointer, step, loss=loss)
    assert [i.path.name for i in list_checkpoints(tmp_path)] == ["step=2", "step=3"]


def test_save_last_keeps_the_newest_and_links_it(tmp_path):
    policy = SavePolicy(save_top_k=1, monitor="loss", mode="min", save_last=True, filename="{step}")
    checkpointer = Checkpointer(tmp_path, policy)
    for step, loss in ((1, 1.0), (2, 3.0), (3, 4.0)):
        save(checkpointer, step, loss=loss)
    assert [i.path.name for i in list_checkpoints(tmp_path)] == ["step=1", "step=3"]
    assert os.readlink(tmp_path / "last") == "step=3"


def test_keep_all_and_version_counter(tmp_path):
    checkpointer = Checkpointer(tmp_path, SavePolicy(save_top_k=-1, filename="same"))
    for step in (1, 2, 3):
        save(checkpointer, step)
    assert sorted(i.path.name for i in list_checkpoints(tmp_path)) == ["same", "same-v1", "same-v2"]


@pytest.mark.parametrize(
    ("number", "text"), [(errno.ENOSPC, "No space left on device"), (errno.EACCES, "Permission denied")]
)
def test_a_write_error_says_what_happened_and_where_and_keeps_the_previous_checkpoint(
    tmp_path, monkeypatch, number, text
):
    """A disk that fills up (or refuses) while a shard is written: one CheckpointError naming the checkpoint
    and the system's reason, no partial folder left, the previous checkpoint still the newest."""
    checkpointer = Checkpointer(tmp_path, SavePolicy(save_top_k=-1, filename="{step}"))
    save(checkpointer, 1)

    def refuse(self, data):
        raise OSError(number, text)

    monkeypatch.setattr("nxd_ckpt.checksumming_writer._HashingStream.write", refuse)
    with pytest.raises(CheckpointError, match=rf"step=2: the save failed: .*{text}"):
        save(checkpointer, 2)
    assert [(i.path.name, i.complete) for i in list_checkpoints(tmp_path)] == [("step=1", True)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step=1"]


def test_same_name_without_counter_replaces_only_when_complete(tmp_path):
    checkpointer = Checkpointer(tmp_path, SavePolicy(save_top_k=-1, filename="same", enable_version_counter=False))
    save(checkpointer, 1)
    save(checkpointer, 2)
    assert [(i.path.name, i.step) for i in list_checkpoints(tmp_path)] == [("same", 2)]


def test_a_failed_save_leaves_the_previous_checkpoint(tmp_path):
    checkpointer = Checkpointer(tmp_path, SavePolicy(save_top_k=1, filename="{step}"))
    save(checkpointer, 1)
    broken = state(2) | {"unpicklable": lambda: None}
    with pytest.raises(CheckpointError, match="the save failed: AttributeError: Can.t pickle"):
        checkpointer.save(broken, step=2, consumed_samples=16, metrics={})
    assert [(i.path.name, i.complete) for i in list_checkpoints(tmp_path)] == [("step=1", True)]
    assert latest_checkpoint(tmp_path).step == 1


def test_half_written_checkpoint_is_skipped_with_a_warning(tmp_path):
    checkpointer = Checkpointer(tmp_path, SavePolicy(save_top_k=-1, filename="{step}"))
    save(checkpointer, 1)
    newer = save(checkpointer, 2)
    (newer / MARKER).unlink()  # as if the process died before every rank finished
    with pytest.warns(CheckpointWarning, match=r"step=2: no completion marker.*using step=1"):
        assert latest_checkpoint(tmp_path).step == 1
    with pytest.raises(CheckpointError, match="no completion marker"):
        load_checkpoint(newer, empty())


def test_truncated_shard_is_refused_and_skipped(tmp_path):
    checkpointer = Checkpointer(tmp_path, SavePolicy(save_top_k=-1, filename="{step}"))
    save(checkpointer, 1)
    newer = save(checkpointer, 2)
    shard = next(newer.glob("*.distcp"))
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size // 2)
    with pytest.raises(CheckpointError, match=rf"{shard.name} is \d+ bytes; the completion marker recorded \d+"):
        load_checkpoint(newer, empty())
    with pytest.warns(CheckpointWarning, match="damaged checkpoint"):
        assert latest_checkpoint(tmp_path).step == 1


def test_another_model_shape_is_refused(tmp_path):
    path = save(Checkpointer(tmp_path, SavePolicy()), 1)
    with pytest.raises(CheckpointError, match=r"another model shape: model.w is \[4, 3\] there, \[6, 3\] here"):
        load_checkpoint(path, empty(rows=6))
    with pytest.raises(CheckpointError, match="it lacks model.extra"):
        load_checkpoint(path, empty() | {"model": empty()["model"] | {"extra": torch.zeros(1)}})


def test_async_save_completes_before_the_next_one(tmp_path):
    checkpointer = Checkpointer(tmp_path, SavePolicy(save_top_k=-1, filename="{step}"), asynchronous=True)
    live = state(1)
    first = checkpointer.save(live, step=1, consumed_samples=8, metrics={})
    live["model"]["w"].add_(100)  # training goes on: the save holds a copy taken at save time
    second = checkpointer.save(state(2), step=2, consumed_samples=16, metrics={})
    assert read_info(first).complete  # the second save waited for the first
    checkpointer.wait()
    assert read_info(second).complete
    loaded = empty()
    load_checkpoint(first, loaded)
    assert torch.equal(loaded["model"]["w"], state(1)["model"]["w"])


def test_due_follows_the_cadence():
    assert [s for s in range(1, 11) if SavePolicy(every_n_train_steps=4).due(s, 0.0)] == [4, 8]
    assert SavePolicy(train_time_interval=60).due(1, 61.0) and not SavePolicy(train_time_interval=60).due(1, 59.0)
    assert not SavePolicy(every_n_train_steps=1, save_top_k=0).due(1, 0.0)
    assert SavePolicy().on_epoch_end and not SavePolicy(every_n_train_steps=5).on_epoch_end
