"""What every `nxd-train` command does alike: load the config with its notices on stderr, and end a
process of a multi-process command."""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path

from nxd_config import ConfigError, ConfigNotice, NxdConfig, load_config


def default_config_path() -> Path:
    """The embedded default config (the same file as configs/tiny.yaml)."""
    return Path(str(resources.files("nxd_train") / "configs" / "tiny.yaml"))


def names(paths: Sequence[Path]) -> str:
    """Config files as messages name them."""
    return ", ".join(str(path) for path in paths)


@contextlib.contextmanager
def notices_to_stderr(quiet: bool = False) -> Iterator[None]:
    """Print the notices nxd's packages raise inside (ConfigNotice, and every warning class of an nxd
    package) as 'notice: ...' lines once the block ends (even on error); `quiet` (the processes a launch starts
    besides the first of each node, which plan the same run again) keeps them to this process."""
    others: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConfigNotice)
            try:
                yield
            finally:
                for warning in caught:
                    if issubclass(warning.category, ConfigNotice) or warning.category.__module__.startswith("nxd_"):
                        if not quiet:
                            print(f"notice: {warning.message}", file=sys.stderr)
                    else:
                        others.append(warning)
    finally:  # another library's warnings go to the handler outside the block (inside it they would be caught again)
        for warning in others:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)


QUIET_EXIT_DELAY = 3.0
"""Seconds a launcher's other processes wait before leaving quietly on a config problem, so that the first
process of the node says it before the launcher ends the rest."""


def load(
    paths: Sequence[Path],
    overrides: Sequence[str],
    dialect: str | None,
    *,
    launch: dict[str, str] | None = None,
    quiet: bool = False,
) -> NxdConfig | None:
    """Load a config, printing notices and errors to stderr; None when it is invalid."""
    try:
        with notices_to_stderr(quiet):
            return load_config(paths, overrides, dialect=dialect, launch=launch)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return None


def exit_if_distributed(code: int = 0, *, group_wide: bool = True) -> None:
    """End a process of a multi-process run: tear down the process group (not when only this rank
    stops: the others would wait for it), flush, and leave without interpreter finalisation, where
    threads of torch.distributed.checkpoint can abort the process."""
    import os

    import torch.distributed

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    if group_wide:
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def preflight_stopped(path: str, error: Exception, quiet: bool) -> int:
    """A run the preflight stopped: the first process of each node says why; the others wait for it to, then
    leave quietly. Returns the exit code, 1."""
    if quiet:
        time.sleep(QUIET_EXIT_DELAY)
        return 1
    print(f"{path}: {error}", file=sys.stderr)
    return 1
