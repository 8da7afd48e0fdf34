"""Errors and warnings of nxd-ckpt."""

from __future__ import annotations

import errno
import sys


class CheckpointError(Exception):
    """A checkpoint that cannot be used as asked: the message names its path, what was expected and what was found."""


class CheckpointWarning(UserWarning):
    """A checkpoint passed over (half written or damaged) in favour of an older complete one."""


def _is_dcp_failure(error: BaseException) -> bool:
    """Whether `error` is DCP's CheckpointException (read from `sys.modules`: discovering checkpoints needs no DCP,
    and nothing raises DCP's exception before DCP is imported)."""
    api = sys.modules.get("torch.distributed.checkpoint.api")
    return api is not None and isinstance(error, api.CheckpointException)


def _causes(error: BaseException) -> list[BaseException]:
    """The failures DCP's CheckpointException carries (every rank's), or the error itself."""
    if _is_dcp_failure(error):
        return [failure[0] if isinstance(failure, tuple) else failure for failure in error.failures.values()]
    return [error]


def cause_of(error: BaseException) -> CheckpointError | None:
    """The CheckpointError nxd-ckpt's own reader raised inside DCP, if that is what `error` wraps."""
    return next((cause for cause in _causes(error) if isinstance(cause, CheckpointError)), None)


def gist(error: BaseException) -> str:
    """The gist of an error (DCP's CheckpointException carries every rank's traceback)."""
    cause = (_causes(error) or [error])[0]
    return str(cause) if isinstance(cause, CheckpointError) else f"{type(cause).__name__}: {cause}"


def out_of_space(error: BaseException) -> OSError | None:
    """The full disk or quota `error` is (or wraps, DCP's failures included), if it is one."""
    seen, pending = set(), [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return current
        if _is_dcp_failure(current):
            pending += _causes(current)
        pending += [current.__cause__, current.__context__]
    return None
