"""The one error type nxd-data raises for data it cannot read or build."""

from __future__ import annotations


class DataError(ValueError):
    """Bad data input: the message names the file (and key or line), what was expected and what was found."""
