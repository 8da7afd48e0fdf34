"""Freed host memory is kept for the next step's allocations: counted in page faults, in fresh processes
(the policy is process-wide)."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="a glibc policy"
)


def _page_bytes() -> int:
    """What one page fault maps: a 2 MiB huge page where transparent huge pages are always on, else 4 KiB."""
    try:
        always = "[always]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        always = False
    return 2 << 20 if always else 4096


PAGES = (64 << 20) // _page_bytes()
"""Page faults of a fresh 64 MiB block, which the probe allocates, fills and frees repeatedly."""

PROBE = """
import ctypes, importlib.util, resource, sys
spec = importlib.util.spec_from_file_location("host_memory", sys.argv[2])
host_memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(host_memory)
if sys.argv[1] == "keep":
    print(host_memory.keep_freed_host_memory())
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
faults = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(ctypes.c_size_t(64 << 20))
    libc.memset(block, 1, 64 << 20)
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults[-1])
"""
"""Allocates, fills and frees 64 MiB four times through glibc's malloc, where torch's CPU allocator takes
its blocks. The module is loaded from its file so that the probe does not import torch: the policy is
glibc's, and a fresh process per case stays cheap."""

MODULE = Path(__file__).parents[2] / "packages/nxd-parallel/src/nxd_parallel/host_memory.py"


def _probe(mode: str, **environment: str) -> tuple[str, int]:
    """The policy's log sentence and the page faults of the last of four 64 MiB allocate-fill-free rounds."""
    inherited = {name: value for name, value in os.environ.items() if not name.startswith(("MALLOC_", "GLIBC_"))}
    env = inherited | environment
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode, str(MODULE)], capture_output=True, text=True, env=env, check=True
    )
    *sentence, faults = done.stdout.strip().splitlines()
    return " ".join(sentence), int(faults)


@glibc
def test_kept_memory_is_reused_without_page_faults() -> None:
    _, default_faults = _probe("default")
    sentence, kept_faults = _probe("keep")
    assert "kept in the process" in sentence
    assert default_faults > PAGES // 2  # glibc unmaps the block on free: every page faults in again
    assert kept_faults < PAGES // 8


@glibc
@pytest.mark.parametrize(
    "environment",
    [{"MALLOC_TRIM_THRESHOLD_": "1048576"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"}],
    ids=["MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"],
)
def test_a_policy_set_in_the_environment_is_kept(environment: dict[str, str]) -> None:
    sentence, faults = _probe("keep", **environment)
    assert f"policy of the environment ({next(iter(environment))}) is kept" in sentence
    assert faults > PAGES // 2  # neither of these alone keeps the block
