"""Older NxDT spellings, rewritten to the current ones with a one-line deprecation notice.

Rewrites run on the unresolved tree (interpolations are still strings), before validation, so
the rest of nxd only ever sees the current spelling.
"""

from __future__ import annotations

import warnings
from typing import Any

from .errors import ConfigDeprecation, ConfigIssue, Described

# (old dotted key, new dotted key); applied in order, so later entries see earlier moves.
KEY_ALIASES: tuple[tuple[str, str], ...] = (
    ("data.alignment_strategy", "model_alignment_strategy"),
    ("model_alignment_strategy.dpo.max_dpo_prompt_length", "model_alignment_strategy.dpo.max_prompt_length"),
    ("data.packing", "model_alignment_strategy.sft.packing"),
    ("exp_manager.exp_log_dir", "exp_manager.explicit_log_dir"),
    ("model.fusions.do_layer_norm_weight_decay", "model.do_layer_norm_weight_decay"),
)

# (dotted key, old value, new value)
VALUE_ALIASES: tuple[tuple[str, str, str], ...] = (("precision.type", "mixed_precision_SR", "mixed_precisionSR"),)


def normalise(tree: dict[str, Any]) -> list[ConfigIssue]:
    """Rewrite older spellings in place; return issues where old and new spellings collide."""
    issues = []
    for old, new in KEY_ALIASES:
        old_parent, old_leaf = _parent(tree, old, create=False)
        if old_parent is None or old_leaf not in old_parent:
            continue
        new_parent, new_leaf = _parent(tree, new, create=True)
        if new_parent is None:
            issues.append(ConfigIssue.mismatch(old, f"a mapping at {new.rpartition('.')[0]} to move into"))
            continue
        if new_leaf in new_parent and new_parent[new_leaf] is not None:
            issues.append(
                ConfigIssue.mismatch(
                    old, f"only one of {old!r} (older spelling) and {new!r}", Described("both set"), f"keep {new!r}"
                )
            )
            del old_parent[old_leaf]  # reported once here, not again as an unknown key
            continue
        new_parent[new_leaf] = old_parent.pop(old_leaf)
        _notice(f"{old!r} is the older spelling of {new!r}; read as {new!r}")
    for path, old_value, new_value in VALUE_ALIASES:
        parent, leaf = _parent(tree, path, create=False)
        if parent is not None and parent.get(leaf) == old_value:
            parent[leaf] = new_value
            _notice(f"{path}: {old_value!r} is the older spelling of {new_value!r}; read as {new_value!r}")
    return issues


def _parent(tree: dict[str, Any], path: str, *, create: bool) -> tuple[dict[str, Any] | None, str]:
    *parents, leaf = path.split(".")
    node: Any = tree
    for part in parents:
        if not isinstance(node, dict):
            return None, leaf
        if node.get(part) is None:
            if not create:
                return None, leaf
            node[part] = {}
        node = node[part]
    return (node, leaf) if isinstance(node, dict) else (None, leaf)


def _notice(message: str) -> None:
    warnings.warn(message, ConfigDeprecation, stacklevel=4)
