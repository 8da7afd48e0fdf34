"""`nxd-train --version`, `config list`, `config copy` and `config keys`: what a user asks before writing a
config (which versions, which examples, which keys)."""

from __future__ import annotations

import difflib
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PACKAGES = (
    "nxd-train",
    "nxd-config",
    "nxd-parallel",
    "nxd-models",
    "nxd-data",
    "nxd-align",
    "nxd-ckpt",
    "nxd-precision",
)
ENGINES = ("torch", "transformers", "lightning-fabric")


def versions() -> str:
    """Each nxd package's installed version, then the engines it runs on."""
    lines = []
    for name in (*PACKAGES, *ENGINES):
        try:
            found = version(name)
        except PackageNotFoundError:
            found = "not installed"
        lines.append(f"{name} {found}")
    return "\n".join(lines)


def list_command() -> int:
    from .example_configs import example_configs, summary

    examples = example_configs()
    width = max(len(example.name) for example in examples)
    for example in examples:
        print(f"{example.name:<{width}}  {example.dialect:<10}  {summary(example.path)}".rstrip())
    print("\n`nxd-train config copy NAME DEST` writes one out; point its data and model keys at your own folders")
    return 0


def copy_command(name: str, destination: Path) -> int:
    from .example_configs import ExampleError, copy_example

    try:
        target = copy_example(name, destination)
    except ExampleError as error:
        print(f"nxd-train config copy: {error}", file=sys.stderr)
        return 1
    print(f"wrote {target}")
    return 0


def keys_command(prefix: str) -> int:
    from nxd_config import Status, key_rows

    rows = key_rows(prefix)
    if not rows:
        every = [row.key for row in key_rows()]
        close = difflib.get_close_matches(prefix, every, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(
            f"nxd-train config keys: {prefix!r}: expected a section or key of the config, found none{hint}",
            file=sys.stderr,
        )
        return 1
    for row in rows:
        effect = row.effect.split(". ")[0].rstrip(".")
        status = "" if row.status in ("", str(Status.HONOURED)) else f"  [{row.status.split(':')[0]}]"
        print(f"{row.key}  ({row.type}; default {row.default}){status}\n    {effect}")
    return 0
