"""The state a GPT-NeoX translation builds (the NxDT tree, where each key came from, notices and refusals)
and the small readers every group of keys uses."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigIssue, show
from .keys import NEOX_KEYS


@dataclass
class Translation:
    """What a NeoX argument set becomes: the NxDT tree, where each of its keys came from, notices and
    refusals (naming NeoX keys)."""

    tree: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Dotted nxd key -> the NeoX keys it was made from."""
    notices: list[str] = field(default_factory=list)
    issues: list[ConfigIssue] = field(default_factory=list)
    read: set[str] = field(default_factory=set)
    """The NeoX keys the translation read."""

    def set(self, path: str, value: Any, *keys: str) -> None:
        *parents, leaf = path.split(".")
        node = self.tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
        self.sources[path] = keys

    def claim(self, path: str, *keys: str) -> None:
        """Record that nxd key `path` stands for NeoX `keys` even where nothing was written to it."""
        self.sources.setdefault(path, keys)

    def refuse(self, key: str, message: str) -> None:
        self.issues.append(ConfigIssue(key, message))

    @property
    def refused(self) -> set[str]:
        """The NeoX keys (top level) some refusal names."""
        return {issue.path.partition(".")[0] for issue in self.issues}

    def notice(self, key: str, message: str) -> None:
        self.notices.append(f"{key}: {message}")


class Arguments:
    """The file's NeoX arguments over NeoX's defaults; remembers which keys were read."""

    def __init__(self, values: dict[str, Any]):
        self.values = values
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return self.values[key] if key in self.values else NEOX_KEYS[key].default

    def given(self, key: str) -> bool:
        return key in self.values and not is_default(self.values[key], NEOX_KEYS[key].default)


def is_default(value: Any, default: Any) -> bool:
    """Whether `value` asks for what NeoX's `default` gives: equal, an unset switch (null, false, an empty
    block) where the default is null, or a DeepSpeed block with enabled: false."""
    if isinstance(value, bool) != isinstance(default, bool) and default is not None:
        return False
    if value == default:
        return True
    if default is None and (value is None or value is False or value == {} or value == []):
        return True
    return default is None and isinstance(value, dict) and value.get("enabled") is False


def typed(t: Translation, a: Arguments, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    """`key`'s value when it has the type the translation computes with, else an error and None."""
    value = a[key]
    wants_bool = kind is bool or (isinstance(kind, tuple) and bool in kind)
    if value is None or isinstance(value, kind) and (wants_bool or not isinstance(value, bool)):
        return value
    t.refuse(key, f"expected {what}, found {show(value)}")
    return None


def choice(t: Translation, a: Arguments, key: str, choices: Iterable[str], refused: str = "") -> str | None:
    """`key`'s value (lower case, as NeoX compares choices) when it is one of `choices`, else an error."""
    value = a[key]
    text = value.lower() if isinstance(value, str) else value
    choices = list(choices)
    if text in choices:
        return text
    why = f": {refused}" if refused else ""
    t.refuse(key, f"expected one of {', '.join(choices)}, found {show(value)}{why}")
    return None


def mapping(t: Translation, key: str, value: Any) -> dict[str, Any] | None:
    """`value` when it is a mapping with string keys (a DeepSpeed block), else an error naming `key` and None."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(name, str) for name in value):
        t.refuse(key, f"expected a mapping of named settings, found {show(value)}")
        return None
    return value
