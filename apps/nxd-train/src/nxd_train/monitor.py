"""What a run reports: console (a progress bar on a terminal, plain lines otherwise), per-rank text
logs, metrics.csv and TensorBoard events in the log directory."""

from __future__ import annotations

import datetime
import logging
import sys
import time
import warnings
from pathlib import Path

from lightning_fabric.loggers import CSVLogger, Logger, TensorBoardLogger
from tqdm import tqdm

FORMATS = {"loss": "{:.4f}", "val_loss": "{:.4f}", "test_loss": "{:.4f}", "lr": "{:.2e}", "grad_norm": "{:.3f}",
           "param_norm": "{:.2f}", "tokens_per_s": "{:,.0f}", "samples_per_s": "{:.1f}", "mfu": "{:.1%}",
           "step_time": "{:.3f}"}  # fmt: skip


class Monitor:
    def __init__(self, log_dir: Path, *, global_rank: int, local_rank: int, total_steps: int,
                 local_rank_0_only: bool, tensorboard: bool):  # fmt: skip
        self.total_steps, self.is_main = total_steps, global_rank == 0
        self.text = logging.getLogger(f"nxd_train.rank{global_rank}")
        self.text.setLevel(logging.INFO)
        self.text.propagate = False
        if local_rank == 0 or not local_rank_0_only:
            handler = logging.FileHandler(log_dir / f"nxd_log_globalrank-{global_rank}_localrank-{local_rank}.txt")
            handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
            self.text.addHandler(handler)
        self.metric_loggers: list[Logger] = []
        self.bar: tqdm | None = None
        if self.is_main:
            with warnings.catch_warnings():  # the directory already holds config.yaml and the text logs
                warnings.filterwarnings("ignore", message="Experiment logs directory")
                csv = CSVLogger(log_dir, name="", version="", flush_logs_every_n_steps=1)  # a crash loses no rows
                csv.experiment  # noqa: B018 - created now, inside this filter
            self.metric_loggers.append(csv)
            if tensorboard:
                self.metric_loggers.append(TensorBoardLogger(log_dir, name="tensorboard", version=""))
            if sys.stderr.isatty():
                self.bar = tqdm(total=total_steps, desc="train", unit="step", dynamic_ncols=True)
        self.started = time.perf_counter()

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
        shown = " | ".join(f"{name} {FORMATS.get(name, '{:.4g}').format(value)}" for name, value in values.items()
                           if name in FORMATS)
        elapsed = time.perf_counter() - self.started
        eta = datetime.timedelta(seconds=round(elapsed / max(step, 1) * (self.total_steps - step)))
        line = f"step {step}/{self.total_steps} | {shown} | eta {eta}"
        self.text.info(line)
        if not self.is_main:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(shown, refresh=False)
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
