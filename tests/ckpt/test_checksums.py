"""A checkpoint that cannot load corrupted: every file's XXH3-64 digest, taken while it was written, is checked
before a byte is trusted. The matrix flips one byte at the start, middle and end of each kind of file
(the tensor shard, DCP's metadata, the marker), truncates and deletes files, touches and copies run
folders: each case is detected (by a CheckpointError, never another exception) or the right
checkpoint is chosen."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
import torch
import xxhash
from nxd_ckpt import (
    MARKER,
    Checkpointer,
    CheckpointError,
    CheckpointWarning,
    SavePolicy,
    latest_checkpoint,
    load_checkpoint,
    read_info,
)
from nxd_train.cli import main

KINDS = ("__0_0.distcp", ".metadata", MARKER)
WHERE = {"start": lambda size: 0, "middle": lambda size: size // 2, "end": lambda size: size - 2}


def _state(step: int) -> dict:
    generator = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(64, 32, generator=generator)},
        "optimizer": {"exp_avg": torch.randn(64, 32, generator=generator)},
        "progress": {"step": step},
    }


def _empty() -> dict:
    return {"model": {"w": torch.zeros(64, 32)}, "optimizer": {"exp_avg": torch.zeros(64, 32)}, "progress": {"step": 0}}


def _run(root):
    checkpointer = Checkpointer(root, SavePolicy(filename="run--{step}", save_top_k=-1))
    return [
        checkpointer.save(_state(step), step=step, consumed_samples=8 * step, metrics={"loss": 1.0 / step})
        for step in (1, 2)
    ]


def _flip(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def test_the_marker_records_the_xxh3_64_of_the_bytes_on_disk(tmp_path):
    first, _ = _run(tmp_path)
    info = read_info(first)
    assert set(info.checksums) == {p.name for p in first.iterdir() if p.name != MARKER}
    for name, digest in info.checksums.items():
        assert digest == f"xxh3_64:{xxhash.xxh3_64((first / name).read_bytes()).hexdigest()}", name  # read whole
    assert not list(first.glob(".nxd-xxh3.*"))  # the writers' sidecars are folded into the marker


@pytest.mark.parametrize("where", sorted(WHERE))
@pytest.mark.parametrize("kind", KINDS)
def test_a_flipped_byte_is_detected_and_the_previous_checkpoint_chosen(tmp_path, kind, where):
    first, second = _run(tmp_path)
    target = second / kind
    _flip(target, WHERE[where](target.stat().st_size))
    with pytest.raises(CheckpointError, match=str(second)):
        read_info(second).verified(contents=True)
    with pytest.raises(CheckpointError):
        load_checkpoint(second, _empty())
    with pytest.warns(CheckpointWarning, match="skipping a checkpoint"):
        assert latest_checkpoint(tmp_path).path == first
    loaded = _empty()
    load_checkpoint(first, loaded)
    assert torch.equal(loaded["optimizer"]["exp_avg"], _state(1)["optimizer"]["exp_avg"])


def test_a_marker_edited_into_other_valid_json_is_detected(tmp_path):
    _, second = _run(tmp_path)
    record = json.loads((second / MARKER).read_text())
    record["step"] = 7
    (second / MARKER).write_text(json.dumps(record))
    with pytest.raises(CheckpointError, match="altered"):
        read_info(second)


@pytest.mark.parametrize("damage", ["truncate", "delete", "append"])
def test_truncated_deleted_or_grown_files_are_detected(tmp_path, damage):
    first, second = _run(tmp_path)
    shard = second / "__0_0.distcp"
    if damage == "truncate":
        os.truncate(shard, shard.stat().st_size - 100)
    elif damage == "delete":
        shard.unlink()
    else:
        with open(shard, "ab") as handle:
            handle.write(b"\0")
    with pytest.raises(CheckpointError, match="damaged checkpoint"):
        load_checkpoint(second, _empty())
    with pytest.warns(CheckpointWarning):
        assert latest_checkpoint(tmp_path).path == first


def test_the_newest_checkpoint_is_the_highest_step_whatever_the_file_times(tmp_path):
    first, second = _run(tmp_path / "run")
    later = time.time() + 3600
    os.utime(first, (later, later))  # `touch` the older one
    assert latest_checkpoint(tmp_path / "run").path == second
    shutil.copytree(tmp_path / "run", tmp_path / "copy")  # a copy gives every folder a new time
    os.utime(tmp_path / "copy" / first.name, (later + 10, later + 10))
    assert latest_checkpoint(tmp_path / "copy").step == 2


def test_ckpt_verify_reports_each_checkpoint(tmp_path, capsys):
    first, second = _run(tmp_path)
    assert main(["ckpt", "verify", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count(": ok: 2 files, digest and sizes match") == 2
    _flip(second / "__0_0.distcp", 100)
    assert main(["ckpt", "verify", str(second)]) == 1
    out = capsys.readouterr().out
    assert f"{second}: DAMAGED:" in out and "has xxh3_64:" in out and "(altered)" in out
    assert main(["ckpt", "list", str(tmp_path)]) == 0  # sizes still match: list reads no contents
    _flip(second / MARKER, 5)
    assert main(["ckpt", "list", str(tmp_path)]) == 0
    assert "DAMAGED" in capsys.readouterr().out
