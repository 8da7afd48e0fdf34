"""Step time and peak memory of every precision type on the same model, from one run.

    uv run python benchmarks/precision.py [--config configs/bench_20m.yaml] [--steps 6]

Each type trains the same model on the same data in a fresh process (so each peak is its own): the
median step time of the steps after the first, and the process's peak resident memory, which
includes the Python and torch runtime every type pays alike. The types take turns `--repeats` times
and each keeps its fastest run, so a burst of load from elsewhere on a shared machine does not land
on one type only. Ratios are against fp32.
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from smoke import TINY_MODEL, parse_args

ROOT = Path(__file__).resolve().parents[1]
TYPES = ("fp32", "autocast", "mixed_precision", "mixed_precisionSR", "bf16SR")


def child(config: Path, precision: str, steps: int, shape: list[str]) -> None:
    from nxd_config import load_config
    from nxd_train.checks.preflight import plan_run
    from nxd_train.run.corpus import default_cache_dir
    from nxd_train.run.loop import train

    with tempfile.TemporaryDirectory() as scratch:
        cfg = load_config(
            config,
            [
                *shape,
                f"precision.type={precision}",
                f"trainer.max_steps={steps}",
                f"+exp_manager.explicit_log_dir={scratch}",
            ],
        )
        train(plan_run(cfg, default_cache_dir()))
        with open(Path(scratch) / "metrics.csv") as handle:
            rows = [row for row in csv.DictReader(handle) if row.get("step_time")]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    step_time = statistics.median(float(row["step_time"]) for row in rows[1:])
    print("RESULT " + json.dumps({"step_time": step_time, "peak_mb": peak_mb, "loss": float(rows[-1]["loss"])}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "bench_20m.yaml")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--types", default=",".join(TYPES))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parse_args(parser, steps=2, repeats=1, types="fp32,bf16SR")
    if args.child:
        child(args.config, args.child, args.steps, TINY_MODEL if args.smoke else [])
        return 0
    results: dict[str, dict] = {}
    for _ in range(args.repeats):
        for precision in args.types.split(","):
            run = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--config",
                    str(args.config),
                    "--steps",
                    str(args.steps),
                    "--child",
                    precision,
                    *(["--smoke"] if args.smoke else []),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            line = next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))
            found = json.loads(line.removeprefix("RESULT "))
            if precision not in results or found["step_time"] < results[precision]["step_time"]:
                results[precision] = found
    base = results.get("fp32") or next(iter(results.values()))
    print(f"{args.config.name}, {args.steps} steps per type, best of {args.repeats}")
    print(f"{'type':<18} {'step time (s)':>13} {'vs fp32':>8} {'peak RSS (MB)':>14} {'vs fp32':>8} {'last loss':>10}")
    for precision, found in results.items():
        time_ratio, memory_ratio = found["step_time"] / base["step_time"], found["peak_mb"] / base["peak_mb"]
        print(
            f"{precision:<18} {found['step_time']:>13.3f} {time_ratio:>7.2f}x {found['peak_mb']:>14,.0f} "
            f"{memory_ratio:>7.2f}x {found['loss']:>10.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
