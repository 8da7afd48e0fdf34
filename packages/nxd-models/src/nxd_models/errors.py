"""The one error type nxd-models raises for a model that cannot be built as asked."""

from __future__ import annotations


class ModelConfigError(ValueError):
    """A model description that cannot be built; the message names the key or file and what was found."""
