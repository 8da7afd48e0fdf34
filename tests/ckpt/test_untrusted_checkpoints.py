"""A checkpoint someone else made runs no code: a crafted pickle in DCP's `.metadata`, in a saved value, in
nxd's random states or in a GPT-NeoX `.pt` file (through a numpy function that calls exec) is refused by
name, with the marker's digests re-sealed as a sender could, and the payload's marker file never appears."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
from numpy.testing._private.utils import runstring
from nxd_ckpt import (
    MARKER,
    Checkpointer,
    CheckpointError,
    HFExport,
    SavePolicy,
    export_hf,
    find_neox_checkpoint,
    load_checkpoint,
    neox_iteration,
    read_info,
)
from nxd_ckpt.checksums import file_digest
from nxd_ckpt.marker import write_marker
from nxd_ckpt.store import saved_keys
from nxd_train.run.training_state import restore_rng_states, rng_states

from tests.neox_checkpoints import pythia_parts, write_neox_checkpoint

from .test_store import empty, state


class Exec:
    """Unpickled, it runs `open(marker, 'w')` through builtins.exec."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').close()",)


class NumpyRunstring(Exec):
    """The same payload through numpy.testing's runstring, a numpy global that calls exec."""

    def __reduce__(self):
        return runstring, (f"open({str(self.marker)!r}, 'w').close()", {})


def reseal(path: Path) -> None:
    """Write the marker again with every file's current digest, as the sender of a crafted checkpoint can."""
    info = read_info(path)
    os.remove(path / MARKER)
    files = [p.name for p in path.iterdir() if p.is_file()]
    write_marker(
        path,
        step=info.step,
        consumed_samples=info.consumed_samples,
        metrics=info.metrics,
        extra=info.extra,
        digests={name: file_digest(path / name) for name in files},
    )
    assert read_info(path).verified(contents=True).complete


def test_a_crafted_metadata_file_is_refused_by_every_reader(tmp_path):
    marker = tmp_path / "ran"
    export = HFExport(config={"model_type": "llama"}, keys={"model.w": "w", "model.b": "b"})
    path = Checkpointer(tmp_path / "ckpts", SavePolicy()).save(
        state(2), step=2, consumed_samples=16, metrics={}, extra={"hf_export": export.to_json()}
    )
    (path / ".metadata").write_bytes(pickle.dumps(Exec(marker)))
    reseal(path)
    readers = {
        "saved_keys": lambda: saved_keys(path),
        "load_checkpoint": lambda: load_checkpoint(path, empty()),
        "export_hf": lambda: export_hf(path, tmp_path / "out"),
    }
    for name, read in readers.items():
        with pytest.raises(CheckpointError, match=r"\.metadata: asks to load the Python object builtins\.exec"):
            read()
        assert not marker.exists(), name


def test_a_crafted_saved_value_is_refused(tmp_path):
    marker = tmp_path / "ran"
    crafted = state(2) | {"progress": {"step": Exec(marker)}}
    path = Checkpointer(tmp_path / "ckpts", SavePolicy()).save(crafted, step=2, consumed_samples=16, metrics={})
    with pytest.raises(
        CheckpointError,
        match=r"consumed_samples=16: its value progress\.step is not plain data .* \(it names the Python "
        r"object exec\); a crafted or foreign file is not read",
    ):
        load_checkpoint(path, empty())
    assert not marker.exists()


def test_random_states_are_json_and_pickled_ones_are_never_unpickled(tmp_path):
    marker = tmp_path / "ran"
    torch.manual_seed(7)
    blob = rng_states()
    expected = torch.rand(3)
    torch.manual_seed(8)
    assert restore_rng_states(blob) and torch.equal(torch.rand(3), expected)
    assert blob.startswith(b"{")
    assert restore_rng_states(pickle.dumps(Exec(marker))) is False
    assert not marker.exists()
    for crafted in (
        b'{"python": 3}',
        b"{not json",
        b'{"python": [3, [1, 2], null], "numpy": [], "torch": [], "cuda": null}',
    ):
        with pytest.raises(CheckpointError, match=r"random states are not the JSON nxd writes"):
            restore_rng_states(crafted)


def test_a_neox_file_with_a_numpy_global_that_runs_code_is_refused(tmp_path):
    from tests.ckpt.test_neox_checkpoint import NEOX_VOCAB, _pythia

    marker = tmp_path / "ran"
    load = tmp_path / "load"
    folder = write_neox_checkpoint(load, pythia_parts(_pythia(), 1, NEOX_VOCAB), iteration=9, pipelined=False)
    first = folder / "mp_rank_00_model_states.pt"
    torch.save(torch.load(first, weights_only=False) | {"args": NumpyRunstring(marker)}, first)
    with pytest.raises(
        CheckpointError,
        match=r"holds objects beyond tensors and numpy arrays "
        r"\(numpy\.testing\._private\.utils\.runstring\)",
    ):
        neox_iteration(find_neox_checkpoint(load))
    assert not marker.exists()
