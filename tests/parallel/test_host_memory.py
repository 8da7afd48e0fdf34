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
"""Page faults of a fresh 64 MiB tensor, which the probe allocates, fills and frees repeatedly."""

PROBE = """
import resource, sys, torch
from nxd_parallel.host_memory import keep_freed_host_memory
if sys.argv[1] == "keep":
    print(keep_freed_host_memory())
faults = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(16 << 20)  # 64 MiB of fp32
    del x
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults[-1])
"""


def _probe(mode: str, **environment: str) -> tuple[str, int]:
    """The policy's log sentence and the page faults of the last of four 64 MiB allocate-fill-free rounds."""
    inherited = {name: value for name, value in os.environ.items() if not name.startswith(("MALLOC_", "GLIBC_"))}
    env = inherited | environment
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env, check=True)
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
