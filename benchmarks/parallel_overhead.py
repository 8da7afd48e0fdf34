"""Step time of the same model under TP1, TP2, DP2 and DP2 + zero1, from one run.

    uv run python benchmarks/parallel_overhead.py [--config configs/bench_20m.yaml] [--steps 8]

Each layout is launched as a user launches it (the nxd-train command, gloo on CPU or NCCL on GPUs)
with the same global batch, and gets the same total CPU threads (cores / processes each), so the
figures compare communication and sharding overhead rather than thread counts. Prints the median
step time after warm-up, tokens/s, and each layout's time relative to TP1.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from smoke import TINY_MODEL, parse_args

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = {
    "TP1": ["trainer.devices=1"],
    "TP2": ["trainer.devices=2", "+distributed_strategy.tensor_model_parallel_size=2"],
    "TP2+SP": [
        "trainer.devices=2",
        "+distributed_strategy.tensor_model_parallel_size=2",
        "+distributed_strategy.sequence_parallel=True",
    ],
    "DP2": ["trainer.devices=2", "distributed_strategy.zero1=False"],
    "DP2+zero1": ["trainer.devices=2", "distributed_strategy.zero1=True"],
}


def step_times(config: Path, overrides: list[str], steps: int, processes: int) -> list[float]:
    with tempfile.TemporaryDirectory() as log_dir:
        threads = max(1, (os.cpu_count() or 1) // processes)
        command = [
            str(Path(sys.executable).with_name("nxd-train")),
            "--config",
            str(config),
            *overrides,
            f"trainer.max_steps={steps}",
            "trainer.log_every_n_steps=1",
            "+exp_manager.log_step_timing=True",
            f"+exp_manager.explicit_log_dir={log_dir}",
        ]
        environment = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        result = subprocess.run(command, capture_output=True, text=True, env=environment, cwd=ROOT)
        if result.returncode:
            raise SystemExit(f"{' '.join(overrides)} failed:\n{result.stderr[-3000:]}")
        with open(Path(log_dir) / "metrics.csv") as handle:
            return [float(row["step_time"]) for row in csv.DictReader(handle) if row.get("step_time")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "bench_20m.yaml")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    args = parse_args(parser, steps=3, layouts="TP1,TP2")
    results = {}
    for name in args.layouts.split(","):
        overrides = LAYOUTS[name]
        processes = int(next(o for o in overrides if o.startswith("trainer.devices=")).split("=")[1])
        times = step_times(args.config, [*(TINY_MODEL if args.smoke else []), *overrides], args.steps, processes)
        results[name] = statistics.median(times[2:])  # the first steps pay for warm-up
    base = results.get("TP1")
    print(f"{args.config.name}, {args.steps} steps, median step time after 2 warm-up steps")
    print(f"{'layout':<12}{'step (s)':>10}{'vs TP1':>9}")
    for name, seconds in results.items():
        ratio = f"{seconds / base:.2f}x" if base else "-"
        print(f"{name:<12}{seconds:>10.3f}{ratio:>9}")


if __name__ == "__main__":
    main()
