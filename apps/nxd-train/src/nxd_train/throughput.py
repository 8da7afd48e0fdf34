"""The matmul ceiling that MFU is reported against, measured on this device in this run."""

from __future__ import annotations

import time

import torch


def matmul_ceiling(device: torch.device, dtype: torch.dtype, seconds: float = 0.3, size: int = 1024) -> float:
    """FLOP/s of a square matmul of `size` on `device` in `dtype`, best of a short timed loop."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    torch.matmul(a, b)  # warm up kernels and caches
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        _synchronize(device)
        start = time.perf_counter()
        for _ in range(4):
            torch.matmul(a, b)
        _synchronize(device)
        best = max(best, 4 * 2 * size**3 / (time.perf_counter() - start))
    return best


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
