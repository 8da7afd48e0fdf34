"""`nxd-train plan` against the peak memory training measures, per layout, on this machine.

    uv run --group bench python benchmarks/memory_plan.py [--layouts 1,tp2,dp2,dp2_zero1,dp2_zero3,pp2] [--steps 2]

For each layout of configs/bench_125m.yaml (sequence 1024, micro-batch 1, global batch 2, AdamW), the
plan's peak per rank (`nxd-train plan`) is set beside the `peak_memory_gib` rank 0 logs over a short
run (host RSS on the CPU, CUDA max allocated on a GPU), each in a fresh process. On the host the run is
measured twice: with glibc's default allocator settings, and with MALLOC_MMAP_THRESHOLD_=131072,
which returns every freed block above 128 KiB to the system instead of keeping it for reuse (glibc
otherwise raises that threshold as blocks are freed, so RSS keeps the high-water mark of each size).
The plan counts live tensors; the second figure is what they occupy.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from smoke import TINY_MODEL, parse_args

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "bench_125m.yaml"
LAYOUTS = {
    "1": [],
    "tp2": ["trainer.devices=2", "+distributed_strategy.tensor_model_parallel_size=2"],
    "dp2": ["trainer.devices=2", "distributed_strategy.zero1=False"],
    "dp2_zero1": ["trainer.devices=2", "distributed_strategy.zero1=True"],
    "dp2_zero3": ["trainer.devices=2", "distributed_strategy.zero1=True", "+distributed_strategy.zero3=True"],
    "pp2": ["trainer.devices=2", "+distributed_strategy.pipeline_model_parallel_size=2"],
}


def _nxd_train(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "nxd_train", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
        check=False,
    )
    return done.stdout + done.stderr


def planned(overrides: list[str]) -> float:
    out = _nxd_train("plan", str(CONFIG), *overrides)
    found = re.search(r"peak ([\d.]+) GiB per rank", out)
    if found is None:
        raise SystemExit(f"nxd-train plan gave no peak:\n{out}")
    return float(found.group(1))


def measured(overrides: list[str], steps: int, env: dict[str, str] | None = None) -> tuple[float, float]:
    """Rank 0's peak memory over the run and its last step's time."""
    with tempfile.TemporaryDirectory() as log_dir:
        out = _nxd_train(
            str(CONFIG),
            *overrides,
            f"trainer.max_steps={steps}",
            "trainer.log_every_n_steps=1",
            f"+exp_manager.explicit_log_dir={log_dir}",
            env=env,
        )
    peaks = [float(value) for value in re.findall(r"peak_memory_gib ([\d.]+)", out)]
    times = [float(value) for value in re.findall(r"step_time ([\d.]+)", out)]
    if not peaks or not times:
        raise SystemExit(f"the run logged no peak memory:\n{out[-3000:]}")
    return max(peaks), times[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default="1,tp2,dp2_zero1")
    parser.add_argument("--steps", type=int, default=3, help="steps per run (from the second, optimizer state exists)")
    args = parse_args(parser, layouts="1", steps=1)
    base = ["data.global_batch_size=2", "data.micro_batch_size=1", *(TINY_MODEL if args.smoke else [])]
    print(
        "| layout | plan (GiB per rank) | measured, glibc default | plan / measured | last step (s) | measured, "
        "MALLOC_MMAP_THRESHOLD_=131072 | plan / measured | last step (s) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for layout in args.layouts.split(","):
        overrides = [*base, *LAYOUTS[layout]]
        plan = planned(overrides)
        (default, default_step) = measured(overrides, args.steps)
        (returned, returned_step) = measured(overrides, args.steps, {"MALLOC_MMAP_THRESHOLD_": "131072"})
        print(
            f"| {layout} | {plan:.2f} | {default:.2f} | {plan / default:.2f} | {default_step:.1f} | {returned:.2f} | "
            f"{plan / returned:.2f} | {returned_step:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
