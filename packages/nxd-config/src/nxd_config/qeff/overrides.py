"""Overrides of a QEfficient file: `section.key=VALUE` as for any nxd file, or QEfficient's own flat
spelling `key=VALUE` (its command line's `--key VALUE`), which names the section whose key it is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .keys import QEFF_KEYS, SECTIONS

ORDER = ("training", "dataset", "model", "optimizers", "scheduler", "callbacks", "dpo")
"""Where a flat key is looked for first (QEfficient's parser reads `seed` as training's; its reference puts
`tokenizer_name` in the dataset section)."""


def qeff_override(override: str, values: Mapping[str, Any]) -> str:
    """`override` with its key in `section.key` form (dashes read as underscores), `+` added where the file
    lacks the key; an unknown flat key is left for the translation's did-you-mean."""
    prefix = override[:1] if override[:1] in "+~" else ""
    key, sep, value = override[len(prefix) :].partition("=")
    key = key.replace("-", "_")
    if key.partition(".")[0] not in SECTIONS:
        key = _section_key(key) or key
    if not prefix and sep and not _present(values, key):
        prefix = "+"
    return f"{prefix}{key}{sep}{value}"


def _section_key(flat: str) -> str | None:
    found = [name for name in QEFF_KEYS if name.rpartition(".")[2] == flat]
    return min(found, key=lambda name: ORDER.index(name.partition(".")[0])) if found else None


def _present(values: Mapping[str, Any], key: str) -> bool:
    node: Any = values
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True
