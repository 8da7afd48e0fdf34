"""The error type nxd-data raises for data it cannot read or build, and its warning type."""

from __future__ import annotations


class DataError(ValueError):
    """Bad data input: the message names the file (and key or line), what was expected and what was found."""


class DataWarning(UserWarning):
    """Something about the data worth saying that does not stop a run (a damaged cache rebuilt)."""
