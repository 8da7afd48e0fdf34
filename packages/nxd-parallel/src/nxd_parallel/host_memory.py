"""Keeping freed host memory in the process, for steps that run on the CPU.

A training step on the CPU frees and allocates the same large tensors every step (logits, their
gradient, activations, gradient buckets). glibc serves each allocation above its mmap threshold with a
fresh mapping and unmaps it on free, so every step faults every page of them in again: on a 2-core VM
a 1024 x 32000 fp32 fill takes 60-150 ms so, and 8 ms on kept pages. Telling glibc never to map large blocks
separately and never to trim the heap keeps the freed pages for the next step's allocations, at the
cost of a peak resident size a few percent higher (the heap cannot shrink between steps).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
"""mallopt parameters, from glibc's malloc.h."""

TRIM_THRESHOLD = 2**31 - 1
"""The largest trim threshold mallopt takes: the heap is never given back to the OS while the run lives."""

ENVIRONMENT_KNOBS = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")
"""glibc's environment settings for the same policy; a user who sets one (or GLIBC_TUNABLES) keeps theirs."""


def keep_freed_host_memory() -> str:
    """Makes glibc keep freed memory in this process for reuse (M_MMAP_MAX 0, M_TRIM_THRESHOLD at its
    maximum), unless the C library is not glibc or the environment already sets its malloc policy.
    Returns a sentence for the run's log saying which of these is in effect."""
    chosen = [name for name in ENVIRONMENT_KNOBS if name in os.environ]
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        chosen.append("GLIBC_TUNABLES")
    if chosen:
        return f"host memory: the malloc policy of the environment ({', '.join(chosen)}) is kept"
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return f"host memory: unchanged (the C library is not glibc: {platform.libc_ver()[0] or sys.platform})"
    libc = ctypes.CDLL(None)
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "host memory: unchanged (glibc refused mallopt)"
    return "host memory: freed memory kept in the process for the next step (glibc M_MMAP_MAX 0, no trimming)"
