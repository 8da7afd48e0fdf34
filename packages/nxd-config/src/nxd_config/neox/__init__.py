"""GPT-NeoX's config dialect: its files read and merged (`files`), every NeoX argument with what nxd does
with it (`keys`), and the translation into NxDT's config tree (`translate`)."""

from .keys import NEOX_KEYS, KeyStatus, NeoXKey

__all__ = ["NEOX_KEYS", "KeyStatus", "NeoXKey"]
