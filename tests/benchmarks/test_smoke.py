"""Every script in benchmarks/ still runs: each with --smoke (tiny shapes, a step or two per column) as a user runs
it, exiting 0 and printing its table; the figures are not looked at. The scripts that start a process per column
against a peer (transformers' Trainer, TRL, torchrun layouts) are slow but for throughput.py, which stands for them
in the default suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
FAST = {
    "adam8bit": "| nxd adam8bit |",
    "ckpt": "nxd-ckpt save (sync)",
    "ckpt_checksums": "nxd ChecksummingWriter",
    "data": "tiny  ",
    "generation": "| nxd_until |",
    "grpo": "| nxd GRPO |",
    "install_sizes": "| nxd-config |",
    "layer_kinds": "| rwkv |",
    "mamba_scan": "| nxd / transformers |",
    "memory_plan": "| 1 |",
    "rwkv_wkv": "| nxd chunked |",
    "throughput": "smoke (0M) fp32",
}
"""Each script the default suite runs, and a line of its table that holds figures."""
SLOW = {
    "float8_gather": "float8 (all_gather: true)",
    "moe": "| moe_ep2 |",
    "neox_125m": "fp32  ",
    "parallel_overhead": "TP2 ",
    "pipeline_context": "CP2    saved for backward",
    "precision": "bf16SR ",
    "preference": "TRL DPOTrainer",
    "qeff_sft": "TRL SFTTrainer + peft",
    "sft": "TRL SFTTrainer (bfd)",
    "startup": "| HF directory, from_pretrained (1 process) |",
}


def test_every_benchmark_has_a_smoke_run():
    scripts = {path.stem for path in BENCHMARKS.glob("*.py")} - {"smoke"}
    assert scripts == FAST.keys() | SLOW.keys()
    without = [name for name in scripts if "parse_args(parser" not in (BENCHMARKS / f"{name}.py").read_text()]
    assert without == [], f"scripts that do not take --smoke: {without}"


@pytest.mark.parametrize(
    ("script", "row"), [*FAST.items(), *(pytest.param(*item, marks=pytest.mark.slow) for item in SLOW.items())]
)
def test_the_smoke_run_prints_its_table(script, row, tmp_path):
    environment = {**os.environ, "UV_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{script}.py"), "--smoke"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env=environment,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert any(line.lstrip().startswith(row.strip()) or row in line for line in done.stdout.splitlines()), done.stdout
