"""QEfficient's fine-tuning config dialect: every key with what nxd does with it (`keys`), its overrides
(`overrides`), and the translation into NxDT's config tree (`translate`)."""

from .keys import QEFF_KEYS, QeffKey

__all__ = ["QEFF_KEYS", "QeffKey"]
