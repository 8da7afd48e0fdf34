"""Is this a DTensor or a FlexAttention block mask? Answered without importing them.

`torch.distributed.tensor` and FlexAttention import sympy (through torch's symbolic shapes): a second and a half
that a command reading a config (`nxd-train config check`, `plan`, `launch`) never needs. Nothing can be an
instance of a class whose module was never imported, so the checks read the classes from `sys.modules`.
"""

from __future__ import annotations

import sys


def is_dtensor(value: object) -> bool:
    """Whether `value` is a `torch.distributed.tensor.DTensor`."""
    tensors = sys.modules.get("torch.distributed.tensor")
    return tensors is not None and isinstance(value, tensors.DTensor)


def is_block_mask(value: object) -> bool:
    """Whether `value` is a FlexAttention `BlockMask`."""
    flex = sys.modules.get("torch.nn.attention.flex_attention")
    return flex is not None and isinstance(value, flex.BlockMask)
