"""What a run reports: console (each logged step as a line, under a live progress bar on a terminal that has a
size), per-rank text logs, metrics.csv, TensorBoard events and a W&B run in the log directory. A run that
continues in its own log directory keeps the rows of the steps its checkpoint covers and appends from there: no
step is lost, none is recorded twice."""

from __future__ import annotations

import contextlib
import csv
import datetime
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from lightning_fabric.loggers import CSVLogger, Logger, TensorBoardLogger
from tqdm import tqdm

from nxd_train.logging.comet_logger import CometLogger
from nxd_train.logging.settings import CometSettings, WandbSettings
from nxd_train.logging.wandb_logger import WandbLogger

FORMATS = {
    "loss": "{:.4f}",
    "val_loss": "{:.4f}",
    "test_loss": "{:.4f}",
    "lr": "{:.2e}",
    "grad_norm": "{:.3f}",
    "param_norm": "{:.2f}",
    "tokens_per_s": "{:,.0f}",
    "samples_per_s": "{:.1f}",
    "mfu": "{:.1%}",
    "step_time": "{:.3f}",
    "skipped_steps": "{:.0f}",
    "peak_memory_gib": "{:.2f}",
    "moe_aux_loss": "{:.4f}",
    "moe_dropped_fraction": "{:.1%}",
    "moe_expert_load_min": "{:.2f}",
    "moe_expert_load_max": "{:.2f}",
}


RANK_LOGS = "nxd_log_globalrank-*_localrank-*.txt"


def rank_log_name(global_rank: int, local_rank: int) -> str:
    """The file name of a rank's text log in the log directory."""
    return f"nxd_log_globalrank-{global_rank}_localrank-{local_rank}.txt"


def _import_tensorboardx() -> None:
    """tensorboardX without the integrations it tries at import: Comet (comet_ml, which pulls matplotlib) and S3
    event files (boto3), each about a second and a half where installed. nxd writes events to local files only and
    logs to Comet itself (`comet_logger`), so they are kept out of its import (both import normally afterwards)."""
    if "tensorboardX" in sys.modules:
        return
    kept_out = [name for name in ("comet_ml", "boto3") if name not in sys.modules]
    for name in kept_out:
        sys.modules[name] = None  # an import of it raises ImportError, which tensorboardX takes as "not installed"
    try:
        import tensorboardX  # noqa: F401
    finally:
        for name in kept_out:
            del sys.modules[name]


class Monitor:
    def __init__(
        self,
        log_dir: Path,
        *,
        global_rank: int,
        local_rank: int,
        total_steps: int,
        local_rank_0_only: bool,
        tensorboard: bool,
        continue_after: int | None = None,
        wandb: WandbSettings | None = None,
        comet: CometSettings | None = None,
        config: dict[str, Any] | None = None,
        json_log_file: str | None = None,
    ):
        """`continue_after`: the step of the checkpoint a run resumes in this directory (rows and events
        of later steps, written before an interruption, are dropped). `wandb`, `comet`: log to W&B, Comet too,
        with the resolved `config`."""
        self.total_steps, self.is_main = total_steps, global_rank == 0
        self.text = logging.getLogger(f"nxd_train.rank{global_rank}")
        self.text.setLevel(logging.INFO)
        self.text.propagate = False
        for stale in list(self.text.handlers):  # a run of this process that ended without closing its logs
            self.text.removeHandler(stale)
            with contextlib.suppress(OSError):  # its own disk may be the full one
                stale.close()
        if local_rank == 0 or not local_rank_0_only:
            handler = _NoFollowFileHandler(log_dir / rank_log_name(global_rank, local_rank))
            handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
            self.text.addHandler(handler)
        self.metric_loggers: list[Logger] = []
        self.bar: tqdm | None = None
        if self.is_main:
            kept = _rows_through(log_dir / "metrics.csv", continue_after) if continue_after is not None else []
            with warnings.catch_warnings():  # the directory already holds config.yaml and the text logs
                warnings.filterwarnings("ignore", message="Experiment logs directory")
                table = CSVLogger(log_dir, name="", version="", flush_logs_every_n_steps=1)  # a crash loses no rows
                table.experiment  # noqa: B018 - created now (it clears metrics.csv), inside this filter
            for row in kept:  # written back: Lightning's logger starts every file anew
                table.log_metrics({name: value for name, value in row.items() if name != "step"}, int(row["step"]))
            self.metric_loggers.append(table)
            if tensorboard:  # purge_step: TensorBoard drops events after the resumed step
                _import_tensorboardx()
                purge = {} if continue_after is None else {"purge_step": continue_after + 1}
                self.metric_loggers.append(TensorBoardLogger(log_dir, name="tensorboard", version="", **purge))
            if wandb is not None:
                self.metric_loggers.append(WandbLogger(log_dir, wandb, config or {}))
            if comet is not None:
                self.metric_loggers.append(CometLogger(log_dir, comet, config or {}))
            if json_log_file is not None:
                self.metric_loggers.append(JsonLinesLog(log_dir / json_log_file, continue_after))
        self.started, self.first_step = time.perf_counter(), 0

    def begin(self, first_step: int) -> None:
        """The loop starts at `first_step` (a resumed run's): the ETA counts only the steps this process runs, and
        the progress bar, on a terminal with a size, starts there. A pseudo-terminal without one (`script -qfc`,
        some schedulers' wrappers) gets the lines alone: tqdm would draw a bar of no width and hide them."""
        self.started, self.first_step = time.perf_counter(), first_step
        if self.is_main and _terminal_width() > 0:
            self.bar = tqdm(total=self.total_steps, initial=first_step, desc="train", unit="step", dynamic_ncols=True)

    def info(self, message: str) -> None:
        """To this rank's log file, and to the console on rank 0."""
        self.text.info(message)
        if self.is_main:
            if self.bar is not None:
                self.bar.write(message)
            else:
                print(message, flush=True)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        """Record metrics of optimizer step `step` (1-based) in every logger, the console and the log file."""
        for logger in self.metric_loggers:
            logger.log_metrics(values, step)
        shown = " | ".join(
            f"{name} {FORMATS.get(name, '{:.4g}').format(value)}" for name, value in values.items() if name in FORMATS
        )
        elapsed = time.perf_counter() - self.started
        eta = datetime.timedelta(seconds=round(elapsed / max(step - self.first_step, 1) * (self.total_steps - step)))
        line = f"step {step}/{self.total_steps} | {shown} | eta {eta}"
        self.text.info(line)
        if not self.is_main:
            return
        if self.bar is not None:  # the line stays on screen above the bar, which keeps the latest loss
            self.bar.write(line)
            if "loss" in values:
                self.bar.set_postfix_str(f"loss {values['loss']:.4f}", refresh=False)
        else:
            print(line, flush=True)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        for logger in self.metric_loggers:
            logger.finalize("success")
        for handler in list(self.text.handlers):
            handler.close()
            self.text.removeHandler(handler)


def _terminal_width() -> int:
    """Columns of the terminal stderr is, 0 when it is none or has no size."""
    if not sys.stderr.isatty():
        return 0
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except OSError:
        return 0


class _NoFollowFileHandler(logging.FileHandler):
    """A text log opened without following a link planted under its name (ELOOP instead of writing elsewhere)."""

    def _open(self):  # noqa: ANN202 - logging's own hook
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
        return os.fdopen(os.open(self.baseFilename, flags, 0o666), "a", encoding=self.encoding, errors=self.errors)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's own hook
        """A log that cannot be written (a full disk) stops the run with one message, not a printed traceback
        per line while it goes on: the error goes to the caller (called inside emit's except)."""
        raise  # noqa: PLE0704 - re-raises the error emit is handling


class JsonLinesLog(Logger):
    """Each logged step as one JSON object (its values and `global_step`) per line, flushed at once; a
    continued run keeps the lines of the steps its checkpoint covers."""

    def __init__(self, path: Path, continue_after: int | None):
        super().__init__()
        kept = []
        if continue_after is not None and path.is_file():
            kept = [line for line in path.read_text().splitlines() if _step_of(line) <= continue_after]
        staging = path.with_name(f".{path.name}.partial")
        staging.write_text("".join(f"{line}\n" for line in kept))
        staging.replace(path)  # the old file stays whole until the kept lines are written
        self.file = open(path, "a")  # noqa: SIM115 - held open for the run's lifetime

    @property
    def name(self) -> str:
        return "json"

    @property
    def version(self) -> str:
        return ""

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.file.write(json.dumps({**metrics, "global_step": step}, separators=(",", ":")) + "\n")
        self.file.flush()

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        return None

    def finalize(self, status: str) -> None:
        self.file.close()


def _step_of(line: str) -> float:
    """A JSON log line's step; infinite for a line cut short by a crash (dropped on resume)."""
    try:
        return json.loads(line).get("global_step", 0)
    except (ValueError, AttributeError):
        return float("inf")


def _rows_through(path: Path, step: int) -> list[dict[str, float]]:
    """The metrics.csv rows of steps up to `step` (empty cells left out)."""
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        rows = [
            {name: float(value) for name, value in row.items() if value not in ("", None)}
            for row in csv.DictReader(handle)
        ]
    return [row for row in rows if row.get("step", step + 1) <= step]
