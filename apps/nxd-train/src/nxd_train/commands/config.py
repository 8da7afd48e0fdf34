"""`nxd-train config` and `--version`: what a user asks before writing a config (which versions, which examples,
which keys: light, nothing of torch loads) and of a config written (show, check, translate)."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nxd_config import NxdConfig

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
    from nxd_train.commands.examples import example_configs, summary

    examples = example_configs()
    width = max(len(example.name) for example in examples)
    for example in examples:
        print(f"{example.name:<{width}}  {example.dialect:<10}  {summary(example.path)}".rstrip())
    print("\n`nxd-train config copy NAME DEST` writes one out; point its data and model keys at your own folders")
    return 0


def copy_command(name: str, destination: Path) -> int:
    from nxd_train.commands.examples import ExampleError, copy_example

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


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        return list_command()
    if args.action == "copy":
        return copy_command(args.name, args.destination)
    if args.action == "keys":
        return keys_command(args.prefix)
    return config_command(args.action, args.files, args.overrides, args.dialect, getattr(args, "to", "nxdt"))


def config_command(
    action: str, paths: Sequence[Path], overrides: Sequence[str], dialect: str | None, to: str = "nxdt"
) -> int:
    from nxd_config import to_nxdt_yaml

    from nxd_train.commands.support import load, names, notices_to_stderr

    config = load(paths, overrides, dialect)
    if config is None:
        return 1
    if action == "show":
        print(to_yaml(config), end="")
        return 0
    if action == "translate":
        print(f"# {names(paths)} as an {to}-dialect nxd config\n" + to_nxdt_yaml(config), end="")
        return 0
    path = names(paths)
    processes = f"{config.world_size} process{'es' if config.world_size != 1 else ''}"
    print(
        f"{path}: valid ({processes}: tp={config.distributed_strategy.tensor_model_parallel_size} "
        f"pp={config.distributed_strategy.pipeline_model_parallel_size} "
        f"cp={config.distributed_strategy.context_parallel_size} dp={config.data_parallel_size}, "
        f"gradient accumulation {config.gradient_accumulation_steps})"
    )
    from nxd_train.checks.preflight import PreflightError, plan_run
    from nxd_train.run.corpus import default_cache_dir  # the same preflight as training, without launching

    try:
        with notices_to_stderr():
            plan_run(config, default_cache_dir(), here=False)
    except PreflightError as error:
        print(
            f"{path}: would stop a run on this machine:\n" + "\n".join(f"  {p}" for p in error.problems),
            file=sys.stderr,
        )
        return 1
    return 0


def to_yaml(config: NxdConfig) -> str:
    """The resolved config as YAML, in the key order of the schema."""
    import yaml

    return yaml.safe_dump(config.model_dump(mode="json", by_alias=True), sort_keys=False)
