"""What a device can do at most: the denominator of MFU (its peak dense FLOP/s for the dtype its
matmuls run in), and the peak memory a run has used on it.

Known accelerators are matched by device name against their datasheets (dense rates, never the
2:4-sparse ones); any other device (a CPU included) gets a ceiling measured on square matmuls grown
until one takes long enough to reach the device's rate (each size's best of repeated trials). A step
faster than its ceiling gets no MFU (`Ceiling.utilisation` is None), never a figure of 100%: a measured
ceiling was taken while other work held the device, a datasheet peak means the FLOP count is off.

A process measures once per device, dtype, matmul precision and thread count: a second run in it (a test
suite's, a notebook's) reads the same ceiling rather than paying half a second again. Separate processes each
measure their own: repeated measurements differ by 5-9% on a shared 2-core machine (benchmarks/RESULTS.md), so a
ceiling kept across processes would carry one moment's load into every later run.
"""

from __future__ import annotations

import functools
import math
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import torch

TERA = 1e12


@dataclass(frozen=True)
class DevicePeak:
    """Datasheet dense peaks in TFLOP/s: bf16/fp16 tensor cores, TF32 tensor cores, plain fp32."""

    match: str
    """A substring of the device's name (torch.cuda.get_device_name)."""
    bf16: float
    tf32: float
    fp32: float


PEAKS = (  # most specific names first: "NVIDIA H100 PCIe" before "H100", "L40S" before "L4", "A100" before "A10"
    DevicePeak("H100 PCIe", 756.4, 378.0, 51.2),
    DevicePeak("H100 NVL", 835.5, 417.5, 60.0),
    DevicePeak("H200 NVL", 835.5, 417.5, 60.0),
    DevicePeak("GH200", 989.4, 494.7, 66.9),
    DevicePeak("H200", 989.4, 494.7, 66.9),
    DevicePeak("H100", 989.4, 494.7, 66.9),  # SXM5 ("NVIDIA H100 80GB HBM3")
    DevicePeak("B200", 2250.0, 1100.0, 75.0),
    DevicePeak("A100", 312.0, 156.0, 19.5),
    DevicePeak("L40S", 362.05, 183.0, 91.6),
    DevicePeak("L4", 121.0, 60.0, 30.3),
    DevicePeak("A10", 125.0, 62.5, 31.2),
    DevicePeak("MI300X", 1307.4, 653.7, 163.4),
)


def datasheet_peak(device_name: str, dtype: torch.dtype, matmul_precision: str = "highest") -> float | None:
    """Peak dense FLOP/s of the named device for matmuls in `dtype` (fp32 ones at torch's
    `matmul_precision`: "highest" is plain fp32, "high" TF32, "medium" bf16); None when not known."""
    for peak in PEAKS:
        if peak.match in device_name:
            if dtype in (torch.bfloat16, torch.float16) or matmul_precision == "medium":
                return peak.bf16 * TERA
            return (peak.tf32 if matmul_precision == "high" else peak.fp32) * TERA
    return None


def measured_peak(device: torch.device, dtype: torch.dtype, *, budget_s: float = 0.6, trials: int = 3) -> float:
    """The best FLOP/s of square matmuls on `device` in `dtype`: sizes doubling from 512 while one matmul
    takes under a tenth of `budget_s` (large enough to reach the device's rate, bounded in time), each size
    timed `trials` times and its fastest kept, so that a moment when other work holds the cores does not
    become the ceiling. The operands come from a generator of their own: the loop's length depends on the
    clock, and drawing from the global one would make the run's later draws (LoRA's initial adapters,
    dropout) vary with it."""
    best, size, deadline = 0.0, 512, time.perf_counter() + budget_s
    generator = torch.Generator().manual_seed(0)  # on the host: not every device type has generators
    while True:
        a = torch.randn(size, size, dtype=dtype, generator=generator).to(device)
        b = torch.randn(size, size, dtype=dtype, generator=generator).to(device)
        torch.matmul(a, b)  # warm up kernels and caches
        _synchronize(device)
        took = math.inf
        for _ in range(trials):
            start = time.perf_counter()
            torch.matmul(a, b)
            _synchronize(device)
            took = min(took, time.perf_counter() - start)
        best = max(best, 2 * size**3 / took)
        if took > budget_s / 10 or size >= 16384 or time.perf_counter() > deadline:
            return best
        size *= 2


@dataclass
class Ceiling:
    """The FLOP/s MFU is reported against, and where it came from (said once in the log)."""

    flops: float
    source: str
    measured: bool

    def utilisation(self, achieved: float) -> float | None:
        """achieved / ceiling; None (unknown) for a rate above the ceiling, never 100%: a measured ceiling was
        taken while other work held the device, and a datasheet peak cannot be beaten (a FLOP count's error)."""
        return None if achieved > self.flops else achieved / self.flops

    def beaten(self) -> str:
        """Why MFU is unknown once a step beats the ceiling (said once in the log)."""
        why = (
            "it was measured while other work held the device"
            if self.measured
            else "a datasheet peak cannot be beaten: the model's FLOP count is off"
        )
        return f"MFU unknown from here on where a step beats the ceiling ({self.source}): {why}"


def device_ceiling(device: torch.device, dtype: torch.dtype) -> Ceiling:
    """The datasheet peak of `device` when it is a known accelerator, otherwise a measured ceiling."""
    precision = torch.get_float32_matmul_precision()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    if device.type == "cuda" and (peak := datasheet_peak(name, dtype, precision)) is not None:
        kind = "bf16" if dtype != torch.float32 or precision == "medium" else "tf32" if precision == "high" else "fp32"
        return Ceiling(peak, f"{name}: datasheet dense {kind} peak, {peak / TERA:,.1f} TFLOP/s", measured=False)
    flops = _measured_once(device, dtype, precision, torch.get_num_threads())
    dtype_name = str(dtype).removeprefix("torch.")
    source = f"{name}: no datasheet peak known, a {dtype_name} matmul measured at {flops / TERA:,.3f} TFLOP/s"
    return Ceiling(flops, f"{source} (the best of repeated trials)", measured=True)


@functools.cache
def _measured_once(device: torch.device, dtype: torch.dtype, precision: str, threads: int) -> float:
    """`measured_peak`, once per process for each key (the precision and threads change what a matmul does)."""
    return measured_peak(device, dtype)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(device: torch.device) -> int:
    """Bytes at most in use so far: tensors allocated on a CUDA device, else this process's resident
    memory (its high-water mark, which includes everything the process holds)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resident_memory(peak=True)


def resident_memory(*, peak: bool = False) -> int:
    """This process's resident bytes now, or (`peak`) its high-water mark: Linux's VmRSS / VmHWM, which
    count this program only (getrusage's maxrss carries over from the process that forked it)."""
    status = Path("/proc/self/status")
    if status.exists():
        field = "VmHWM:" if peak else "VmRSS:"
        for line in status.read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
