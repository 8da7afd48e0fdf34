"""examples/plain_pytorch.py, nxd's packages used as libraries in a plain PyTorch script (no nxd-train),
runs on 2 gloo processes under torch's own launcher and resumes exactly from its checkpoint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _launch(out: Path, *extra: str) -> dict[int, str]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(ROOT / "examples" / "plain_pytorch.py"),
            "--out",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line.split() for line in result.stdout.splitlines() if line.startswith("step ")]
    return {int(words[1]): words[3] for words in lines}


def test_the_library_example_trains_on_two_processes_and_resumes_exactly(tmp_path):
    whole = _launch(tmp_path)
    assert sorted(whole) == [1, 2, 3, 4, 5, 6] and len(set(whole.values())) == 6
    assert (tmp_path / "checkpoints" / "step=4" / "nxd-checkpoint.json").is_file()
    resumed = _launch(tmp_path, "--resume", str(tmp_path / "checkpoints" / "step=4"), "--save-at", "0")
    assert resumed == {5: whole[5], 6: whole[6]}  # printed to ten decimals: the same losses
