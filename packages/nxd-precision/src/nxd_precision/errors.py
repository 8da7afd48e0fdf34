"""The one error type nxd-precision raises for a precision request it cannot honour."""

from __future__ import annotations


class PrecisionConfigError(ValueError):
    """A precision type or knob combination that cannot be applied; the message names the key."""
