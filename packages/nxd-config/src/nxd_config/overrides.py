"""Command-line overrides, Hydra style.

- `a.b=value` replaces a key the file has (value parsed as YAML, so `lr=1e-4` is a number);
- `+a.b=value` adds a key the file lacks;
- `~a.b` deletes a key.
Changing a key the file lacks without `+`, or adding one it has, is an error: a typo in an
override must never pass silently.
"""

from __future__ import annotations

from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .errors import ConfigIssue, Described

_ABSENT = object()


def apply_overrides(config: DictConfig, overrides: list[str] | tuple[str, ...]) -> list[ConfigIssue]:
    """Apply overrides in order; return an issue for each one that cannot be applied."""
    issues = []
    for override in overrides:
        issue = _apply(config, override)
        if issue is not None:
            issues.append(issue)
    return issues


def _apply(config: DictConfig, override: str) -> ConfigIssue | None:
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
        return ConfigIssue.mismatch(key, f"a key the file lacks for '+{key}=...'", Described("it set in the file"),
                                    f"use {key}=... to change it")
    if not add and not exists:
        return ConfigIssue.mismatch(key, f"a key the file has for '{key}=...'", Described("no such key in the file"),
                                    f"use +{key}=... to add it")
    try:
        OmegaConf.update(config, key, value, merge=False, force_add=True)
    except OmegaConfBaseException as exc:
        return ConfigIssue.mismatch(key, "a key that can hold a value", override, _first_line(exc))
    return None


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
