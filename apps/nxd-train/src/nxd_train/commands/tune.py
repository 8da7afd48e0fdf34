"""`nxd-train tune`: a search of micro-batch size x ZeRO stage for a config (DeepSpeed's autotuner in its fast
mode; GPT-NeoX's autotuning block). Candidates the memory plan says do not fit are left out; each other one
trains `tune.end_step` steps through the run's own launcher, and the fastest, by the median tokens/s over steps
`tune.start_step`..`tune.end_step`, is written as a config file beside the table of what was measured."""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nxd_config import ConfigError, NxdConfig, load_config, nxdt_yaml_with, to_nxdt_yaml

RUN_TIMEOUT = 3600
"""Seconds a candidate's run may take before it counts as failed."""


@dataclass(frozen=True)
class Candidate:
    micro_batch_size: int
    zero: int
    """0: replicated, 1: zero1, 3: zero1 and zero3."""

    @property
    def label(self) -> str:
        return f"micro-batch {self.micro_batch_size}, ZeRO {self.zero}"

    def keys(self) -> dict[str, Any]:
        """The dotted keys this candidate sets, and their values."""
        return {
            "data.micro_batch_size": self.micro_batch_size,
            "distributed_strategy.zero1": self.zero >= 1,
            "distributed_strategy.zero3": self.zero == 3,
        }

    def applied(self, config: NxdConfig) -> NxdConfig:
        for dotted, value in self.keys().items():
            config = with_value(config, dotted, value)
        return config


@dataclass
class Outcome:
    candidate: Candidate
    tokens_per_s: float | None = None
    why_not: str | None = None
    """Why it was not timed or its run failed."""


def candidates(config: NxdConfig) -> list[Candidate]:
    """Every micro-batch size that divides a rank's share of the global batch (or those listed) x every ZeRO stage
    (those listed, else 0, 1 and 3 with data parallelism, 0 alone without)."""
    tune, dp = config.tune, config.data_parallel_size
    share = config.global_batch_size // dp
    sizes = list(tune.micro_batch_sizes) or [
        size
        for size in range(tune.min_micro_batch_size, min(tune.max_micro_batch_size, share) + 1)
        if share % size == 0
    ]
    stages = list(tune.zero_stages) or ([0, 1, 3] if dp > 1 else [0])
    return [Candidate(size, stage) for stage in stages for size in sizes]


def with_value(section: Any, dotted: str, value: Any) -> Any:
    """A copy of `section` with the key at `dotted` set (and counted as set, so that the written file holds it)."""
    head, _, rest = dotted.partition(".")
    new = value if not rest else with_value(getattr(section, head), rest, value)
    return section.model_copy(update={head: new})


def timing_config(config: NxdConfig, candidate: Candidate, log_dir: Path) -> NxdConfig:
    """The candidate's short run: `tune.end_step` steps logged each step, no validation, checkpoints or outside
    loggers, in `log_dir`."""
    config = candidate.applied(config)
    for dotted, value in (
        ("trainer.max_steps", config.tune.end_step),
        ("trainer.log_every_n_steps", 1),
        ("trainer.limit_val_batches", 0),
        ("trainer.num_sanity_val_steps", 0),
        ("trainer.limit_test_batches", 0),
        ("exp_manager.create_checkpoint_callback", False),
        ("exp_manager.create_tensorboard_logger", False),
        ("exp_manager.create_wandb_logger", False),
        ("exp_manager.create_comet_logger", False),
        ("exp_manager.resume_if_exists", False),
        ("exp_manager.resume_from_checkpoint", None),
        ("exp_manager.explicit_log_dir", str(log_dir)),
    ):
        config = with_value(config, dotted, value)
    return config


def written_and_checked(config: NxdConfig, path: Path) -> str | None:
    """Write `config` as NxDT YAML at `path` and read it back; the reason it is not a valid config, or None."""
    path.write_text(to_nxdt_yaml(config))
    try:
        load_config([path], [])
    except ConfigError as error:
        return str(error).splitlines()[-1].strip()
    return None


def measured(log_dir: Path, start: int, end: int) -> float | None:
    """The median tokens/s of steps start..end in the run's metrics.csv, or None when they are missing."""
    path = log_dir / "metrics.csv"
    if not path.is_file():
        return None
    with open(path) as handle:
        rates = [
            float(row["tokens_per_s"])
            for row in csv.DictReader(handle)
            if row.get("tokens_per_s") and start <= int(float(row["step"])) <= end
        ]
    return statistics.median(rates) if rates else None


def time_candidate(config: NxdConfig, candidate: Candidate, folder: Path) -> Outcome:
    """Train the candidate's short run with the nxd-train command (its launcher, its processes)."""
    log_dir = folder / "run"
    file = folder / "config.yaml"
    if why := written_and_checked(timing_config(config, candidate, log_dir), file):
        return Outcome(candidate, why_not=why)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "nxd_train", str(file)],
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    except subprocess.TimeoutExpired:
        return Outcome(candidate, why_not=f"its run took more than {RUN_TIMEOUT} s")
    if done.returncode != 0:
        last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "no message")
        return Outcome(candidate, why_not=f"its run failed (exit {done.returncode}): {last.strip()}")
    rate = measured(log_dir, config.tune.start_step, config.tune.end_step)
    return Outcome(candidate, tokens_per_s=rate, why_not=None if rate else "its run logged no tokens/s")


def tune(config: NxdConfig, fits: Any, say: Any) -> list[Outcome]:
    """Each candidate pruned by `fits(config) -> (fits, peak text)` or timed; `say` reports each as it ends."""
    outcomes = []
    for candidate in candidates(config):
        applied = candidate.applied(config)
        fitting, peak = fits(applied)
        if not fitting:
            outcome = Outcome(candidate, why_not=f"does not fit: {peak}")
        else:
            with tempfile.TemporaryDirectory(prefix="nxd-tune-") as folder:
                outcome = time_candidate(config, candidate, Path(folder))
        say(
            f"{candidate.label}: "
            + (f"{outcome.tokens_per_s:,.0f} tokens/s" if outcome.tokens_per_s else f"left out: {outcome.why_not}")
        )
        outcomes.append(outcome)
    return outcomes


def fastest(outcomes: Sequence[Outcome]) -> Outcome | None:
    timed = [outcome for outcome in outcomes if outcome.tokens_per_s]
    return max(timed, key=lambda outcome: outcome.tokens_per_s) if timed else None


def run(args: argparse.Namespace) -> int:
    """Search, print what each candidate measured, and write the fastest config (never over a file that exists)."""
    files, overrides, dialect = args.files, args.overrides, args.dialect
    device_memory, output = args.device_memory, args.output
    from nxd_train.checks.memory import memory_report
    from nxd_train.checks.preflight import PreflightError, plan_run
    from nxd_train.commands.support import load, notices_to_stderr
    from nxd_train.run.corpus import default_cache_dir

    config = load(files, overrides, dialect)
    if config is None:
        return 1
    names = ", ".join(map(str, files))
    output = output or Path(f"{config.name}-tuned.yaml")
    if output.exists():
        print(f"nxd-train tune: {output} exists; expected a new file for the tuned config (--output)", file=sys.stderr)
        return 1

    def fits(candidate_config: NxdConfig) -> tuple[bool, str]:
        try:
            with notices_to_stderr(quiet=True):
                plan = plan_run(candidate_config, default_cache_dir(), data_required=False, here=False)
        except PreflightError as error:
            return False, "; ".join(error.problems)
        report, fitting = memory_report(plan, device_memory)
        lines = report.splitlines()
        return fitting, next((line for line in lines if line.startswith("peak ")), lines[-1])

    found = candidates(config)
    if not found:
        share, tune_keys = config.global_batch_size // config.data_parallel_size, config.tune
        print(
            f"{names}: tune: no candidate: no micro-batch size from {tune_keys.min_micro_batch_size} to "
            f"{tune_keys.max_micro_batch_size} divides a rank's {share} samples of the global batch",
            file=sys.stderr,
        )
        return 1
    print(
        f"{names}: tune: {len(found)} candidate(s), each timed over steps {config.tune.start_step}.."
        f"{config.tune.end_step}",
        flush=True,
    )
    outcomes = tune(config, fits, lambda line: print(f"  {line}", flush=True))
    best = fastest(outcomes)
    if best is None:
        print(f"{names}: tune: no candidate ran; see each line above for why", file=sys.stderr)
        return 1
    keys = best.candidate.keys()  # an NxDT file keeps its interpolations: the original, overridden, plus these keys
    try:  # the file as it is now: it was read (and timed) as it was when tune began
        text = nxdt_yaml_with(files[0], overrides, keys) if len(files) == 1 and dialect in (None, "nxdt") else None
    except ConfigError as error:
        print(
            f"nxd-train tune: {error}; expected the file tune began with (was it changed meanwhile?)", file=sys.stderr
        )
        return 1
    try:
        with open(output, "x") as handle:
            handle.write(text if text is not None else to_nxdt_yaml(best.candidate.applied(config)))
    except OSError as error:
        print(f"nxd-train tune: {output}: cannot be written: {error.strerror or error}", file=sys.stderr)
        return 1
    print(f"fastest: {best.candidate.label}, {best.tokens_per_s:,.0f} tokens/s; written to {output}")
    return 0
