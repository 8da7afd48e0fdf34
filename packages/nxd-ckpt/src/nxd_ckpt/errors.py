"""Errors and warnings of nxd-ckpt."""

from __future__ import annotations


class CheckpointError(Exception):
    """A checkpoint that cannot be used as asked: the message names its path, what was expected and what was found."""


class CheckpointWarning(UserWarning):
    """A checkpoint passed over (half written or damaged) in favour of an older complete one."""
