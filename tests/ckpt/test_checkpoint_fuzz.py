"""Checkpoints with one file altered at random — bits flipped, truncated, a crafted pickle in its metadata or
in a value, bits flipped with the marker re-sealed (as a sender can), a file swapped for a link — through
`ckpt verify`, `ckpt export-hf` and the loader a resume uses: never a traceback, never the payload run, and
damage the marker records never loaded as if it were the saved data."""

from __future__ import annotations

import pickle
import random
import shutil
import traceback
from pathlib import Path

import pytest
import torch
from nxd_ckpt import MARKER, Checkpointer, CheckpointError, HFExport, SavePolicy, load_checkpoint
from nxd_train.commands.ckpt import export_command, verify_command

from .test_store import empty, state
from .test_untrusted_checkpoints import Exec, reseal

KINDS = ("flip", "truncate", "crafted_metadata", "crafted_value", "link", "flip_resealed")
CASES = 200
DEFAULT_CASES = 20
"""The default suite runs the first 20 (every kind); --runslow all 200."""


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    export = HFExport(config={"model_type": "llama"}, keys={"model.w": "w", "model.b": "b"})
    root = tmp_path_factory.mktemp("pristine")
    return Checkpointer(root, SavePolicy()).save(
        state(5), step=5, consumed_samples=40, metrics={"loss": 1.0}, extra={"hf_export": export.to_json()}
    )


def _mutate(folder: Path, kind: str, draw: random.Random, marker: Path) -> None:
    files = sorted(path for path in folder.iterdir() if path.name != MARKER)
    target = draw.choice(files)
    data = bytearray(target.read_bytes())
    if kind in ("flip", "flip_resealed"):
        for _ in range(draw.randint(1, 4)):
            at = draw.randrange(len(data))
            data[at] ^= 1 << draw.randrange(8)
        target.write_bytes(bytes(data))
        if kind == "flip_resealed":  # a checkpoint whose sender changed it: no digest can tell
            reseal(folder)
    elif kind == "truncate":
        target.write_bytes(bytes(data[: draw.randrange(len(data))]))
    elif kind == "crafted_metadata":
        (folder / ".metadata").write_bytes(pickle.dumps(Exec(marker), protocol=draw.choice([2, 4, 5])))
        reseal(folder)
    elif kind == "crafted_value":
        shutil.rmtree(folder)
        crafted = state(5) | {"progress": {"step": Exec(marker)}}
        saved = Checkpointer(folder.parent / f"{folder.name}-src", SavePolicy()).save(
            crafted, step=5, consumed_samples=40, metrics={}
        )
        saved.rename(folder)
    else:  # a file swapped for a link to another file of the checkpoint (or to one outside it)
        other = draw.choice([path for path in files if path != target] or [marker.parent / "outside"])
        other.parent.mkdir(parents=True, exist_ok=True)
        if not other.exists():
            other.write_bytes(b"outside data")
        target.unlink()
        target.symlink_to(other)


def _no_traceback(call, capsys) -> tuple[int, str]:
    try:
        code = call()
    except Exception:  # noqa: BLE001 - the finding this test exists for
        pytest.fail(f"a traceback:\n{traceback.format_exc()}")
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert "Traceback" not in output, output
    return code, output


@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=[pytest.mark.slow] if case >= DEFAULT_CASES else []) for case in range(CASES)]
)
def test_an_altered_checkpoint_is_refused_or_read_as_saved(tmp_path, pristine, capsys, case):
    draw = random.Random(case)
    kind, marker = KINDS[case % len(KINDS)], tmp_path / "payload-ran"
    folder = tmp_path / pristine.name
    shutil.copytree(pristine, folder)
    _mutate(folder, kind, draw, marker)
    verified, _ = _no_traceback(lambda: verify_command(folder), capsys)
    exported, _ = _no_traceback(lambda: export_command(folder, tmp_path / "hf", None), capsys)
    loaded = empty()
    try:
        load_checkpoint(folder, loaded)
    except CheckpointError:
        loaded = None
    assert not marker.exists(), kind
    if kind in ("flip", "truncate", "link"):  # damage the marker's digests catch
        assert verified == 1 and exported == 1 and loaded is None, kind
    elif kind == "crafted_value" and loaded is not None:  # refused where it asks for code, else the saved values
        assert all(torch.equal(loaded["model"][k], state(5)["model"][k]) for k in ("w", "b"))
        assert loaded["progress"] == {"step": 5}, kind
