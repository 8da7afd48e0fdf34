"""DTensor checks that do not import `torch.distributed.tensor` (it loads sympy, which a command that only reads a
config never needs): nothing is a DTensor before that module is imported."""

from __future__ import annotations

import sys


def is_dtensor(value: object) -> bool:
    """Whether `value` is a `torch.distributed.tensor.DTensor`."""
    tensors = sys.modules.get("torch.distributed.tensor")
    return tensors is not None and isinstance(value, tensors.DTensor)
