"""Command-line overrides, Hydra style.

- `a.b=value` replaces a key the file has (value parsed as YAML, so `lr=1e-4` is a number);
- `+a.b=value` adds a key the file lacks;
- `~a.b` deletes a key.
Changing a key the file lacks without `+`, or adding one it has, is an error: a typo in an
override must never pass silently. Given the keys the dialect defines, a key that is neither in the file nor
defined gets a did-you-mean instead of the advice to add it.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .errors import ConfigIssue, Described

_ABSENT = object()


def apply_overrides(
    config: DictConfig, overrides: list[str] | tuple[str, ...], defined: Collection[str] = ()
) -> list[ConfigIssue]:
    """Apply overrides in order; return an issue for each one that cannot be applied. `defined` holds the dotted
    keys the dialect defines (sections included), for the advice on a key the file lacks."""
    issues = []
    for override in overrides:
        issue = _apply(config, override, defined)
        if issue is not None:
            issues.append(issue)
    return issues


def _apply(config: DictConfig, override: str, defined: Collection[str]) -> ConfigIssue | None:
    text = override.strip()
    if text.startswith("~"):
        return _delete(config, text[1:].split("=", 1)[0], override)
    add = text.startswith("+")
    if add:
        text = text[1:]
    key, sep, raw_value = text.partition("=")
    if not sep or not key or not _valid_key(key):
        return ConfigIssue.mismatch(
            f"override {override!r}", "KEY=VALUE, +KEY=VALUE or ~KEY with a dotted KEY such as trainer.max_steps"
        )
    try:
        value = _parse_value(raw_value)
    except (OmegaConfBaseException, yaml.YAMLError) as exc:
        return ConfigIssue.mismatch(f"override {override!r}", "a YAML value", raw_value, _first_line(exc))
    exists = _get(config, key) is not _ABSENT
    if add and exists:
        return ConfigIssue.mismatch(
            key,
            f"a key the file lacks for '+{key}=...'",
            Described("it set in the file"),
            f"use {key}=... to change it",
        )
    if not add and not exists:
        return _absent(config, key, defined)
    try:
        OmegaConf.update(config, key, value, merge=False, force_add=True)
    except OmegaConfBaseException as exc:
        return ConfigIssue.mismatch(key, "a key that can hold a value", override, _first_line(exc))
    return None


def _absent(config: DictConfig, key: str, defined: Collection[str]) -> ConfigIssue:
    """`key=...` for a key the file lacks: the advice to add it when the dialect defines it (or nothing is known
    of the dialect's keys), the closest key of the file or the dialect otherwise."""
    if not defined or key in defined or _free_form(key, defined):
        return ConfigIssue.mismatch(
            key,
            f"a key the file has for '{key}=...'",
            Described("no such key in the file"),
            f"use +{key}=... to add it",
        )
    candidates = sorted({*defined, *_file_keys(OmegaConf.to_container(config, resolve=False))})
    parent, _, leaf = key.rpartition(".")
    siblings = {c.rpartition(".")[2]: c for c in candidates if c.rpartition(".")[0] == parent}
    close = [siblings[name] for name in difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.75)]
    if not close:  # the right name in the wrong section
        near = [c for c in candidates if difflib.get_close_matches(leaf, [c.rpartition(".")[2]], cutoff=0.85)]
        close = sorted(near, key=lambda c: c.count("."))[:1]
    hint = f"did you mean {close[0]!r}?" if close else "nxd-train config keys lists every key"
    return ConfigIssue.mismatch(
        key, f"a key the file has or the config defines for '{key}=...'", Described("no such key"), hint
    )


def _free_form(key: str, defined: Collection[str]) -> bool:
    """A key inside a list, or inside a defined key that holds a free mapping (the schema names no keys in it)."""
    parts = key.split(".")
    if any(part.isdigit() for part in parts):
        return True
    ancestors = [".".join(parts[:end]) for end in range(1, len(parts))]
    return any(a in defined and not any(d.startswith(f"{a}.") for d in defined) for a in ancestors)


def _file_keys(tree: Any, prefix: str = "") -> list[str]:
    if not isinstance(tree, dict):
        return []
    keys = []
    for name, value in tree.items():
        keys.append(f"{prefix}{name}")
        keys += _file_keys(value, f"{prefix}{name}.")
    return keys


def _delete(config: DictConfig, key: str, override: str) -> ConfigIssue | None:
    if not key or not _valid_key(key):
        return ConfigIssue.mismatch(f"override {override!r}", "~KEY with a dotted KEY such as trainer.lnc")
    if _get(config, key) is _ABSENT:
        return ConfigIssue.mismatch(key, f"a key the file has for '~{key}'", Described("no such key in the file"))
    parent_key, _, leaf = key.rpartition(".")
    parent = config if not parent_key else OmegaConf.select(config, parent_key, throw_on_resolution_failure=False)
    if isinstance(parent, DictConfig):
        del parent[leaf]
    elif isinstance(parent, ListConfig) and leaf.isdigit():
        del parent[int(leaf)]
    return None


def _get(config: DictConfig, key: str) -> Any:
    try:
        return OmegaConf.select(config, key, default=_ABSENT, throw_on_resolution_failure=False)
    except OmegaConfBaseException:
        return _ABSENT


def _parse_value(text: str) -> Any:
    """Parse with OmegaConf's YAML rules (1e-4 is a float, ${...} stays an interpolation)."""
    parsed = OmegaConf.from_dotlist([f"value={text}"])
    return OmegaConf.to_container(parsed, resolve=False)["value"]


def _valid_key(key: str) -> bool:
    return all(part and part.replace("_", "").replace("-", "").isalnum() for part in key.split("."))


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
