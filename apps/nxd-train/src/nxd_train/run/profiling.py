"""The profiler window (exp_manager.profiler): torch.profiler over a few optimizer steps, and memory records
of the same steps, one file per rank in the log directory.

A run without the window builds none of this, so its steps carry no profiling cost. Files are written under a
temporary name and renamed when complete, so a reader never sees half a trace; their names carry the time in
milliseconds, as torch's tensorboard_trace_handler names them, so a resumed run adds files beside earlier ones.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

STEP_RANGE = "ProfilerStep#{step}"
"""Each profiled step's range in the trace, as torch.profiler's own schedule names its steps (TensorBoard's
profiler plugin splits a trace into steps by it)."""
MEMORY_HISTORY_ENTRIES = 100_000
"""Allocation events a CUDA memory snapshot keeps (GPT-NeoX's trace_alloc_max_entries)."""


@dataclass(frozen=True)
class ProfilerWindow:
    """Which optimizer steps are profiled (counted from 1, both ends included) and what is recorded."""

    start_step: int
    stop_step: int
    trace: bool = True
    """torch.profiler's trace (exp_manager.profiler.enabled)."""
    memory: bool = False
    """Memory records: a CUDA memory snapshot, or the profiler's memory timeline elsewhere."""
    memory_dir: Path | None = None
    """Where memory records go (None: beside the traces)."""


class StepProfiler:
    """Opens the window at its first step, wraps each step in a named range, and writes this rank's files
    after its last step (or when the run ends inside it)."""

    def __init__(
        self, window: ProfilerWindow, log_dir: Path, device: torch.device, rank: int, say: Callable[[str], None]
    ):
        self.window, self.device, self.rank, self.say = window, device, rank, say
        self.trace_dir = log_dir / "profiler"
        self.memory_dir = window.memory_dir or self.trace_dir
        self.cuda_memory = window.memory and device.type == "cuda"
        self.profiler: profile | None = None
        self.first: int | None = None
        self.last = 0

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Optimizer step `step` (counted from 1): inside the window it is recorded."""
        if not self.window.start_step <= step <= self.window.stop_step:
            yield
            return
        if self.first is None:
            self._open(step)
        with record_function(STEP_RANGE.format(step=step)) if self.profiler is not None else contextlib.nullcontext():
            yield
        self.last = step
        if step == self.window.stop_step:
            self.close()

    def close(self) -> None:
        """Write what the window recorded (the run may end inside it, before stop_step)."""
        if self.first is None:
            return
        first, last = self.first, self.last
        self.first = None
        stamp = int(time.time() * 1000)
        written = []
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            if self.window.trace:
                torch.cuda.cudart().cudaProfilerStop()
        if self.cuda_memory:
            path = self._path(self.memory_dir, f"{stamp}.memory_snapshot.pickle")
            _write(path, torch.cuda.memory._dump_snapshot)
            torch.cuda.memory._record_memory_history(enabled=None)
            written.append(path)
        if self.profiler is not None:
            self.profiler.stop()
            if self.window.trace:
                path = self._path(self.trace_dir, f"{stamp}.pt.trace.json")
                _write(path, self.profiler.export_chrome_trace)
                written.append(path)
            if self.window.memory and not self.cuda_memory:
                path = self._path(self.memory_dir, f"{stamp}.memory_timeline.html")
                with warnings.catch_warnings():  # deprecated for CUDA's snapshots, the only record elsewhere
                    warnings.simplefilter("ignore", FutureWarning)
                    _write(path, lambda name: self.profiler.export_memory_timeline(name, device=str(self.device)))
                written.append(path)
            self.profiler = None
        if self.rank == 0:
            self.say(
                f"exp_manager.profiler: steps {first}..{last} recorded in {', '.join(map(str, written))} (and "
                "each rank's files beside them)"
            )

    def _open(self, step: int) -> None:
        self.first = step
        if self.cuda_memory:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
        if self.window.trace or not self.cuda_memory:
            self.profiler = profile(
                activities=activities(self.device),
                record_shapes=True,
                profile_memory=True,
                with_stack=True,
                with_flops=True,
            )
            self.profiler.start()
        if self.device.type == "cuda" and self.window.trace:  # nsys's capture range: profile's, as in GPT-NeoX
            torch.cuda.cudart().cudaProfilerStart()

    def _path(self, folder: Path, suffix: str) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"rank{self.rank}.{suffix}"


def activities(device: torch.device) -> list[ProfilerActivity]:
    """What the profiler records on `device`: the host, and the device's own activity where torch has it."""
    found = [ProfilerActivity.CPU]
    kind = {"cuda": "CUDA", "xpu": "XPU", "mtia": "MTIA", "hpu": "HPU"}.get(device.type, "PrivateUse1")
    activity = getattr(ProfilerActivity, kind, None)
    if device.type != "cpu" and activity in torch.profiler.supported_activities():
        found.append(activity)
    return found


def _write(path: Path, export: Callable[[str], object]) -> None:
    """`export` writes `path` whole: under a temporary name, renamed when complete."""
    partial = path.with_name(f".partial.{path.name}")  # the suffix stays: the exporters choose a format by it
    export(str(partial))
    os.replace(partial, path)
