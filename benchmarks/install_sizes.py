"""Each package's installed size alone: its wheel (built from a source tree) installed with only what it requires
(no extras) into a fresh virtualenv, at the lock's versions, and the size of that virtualenv's site-packages.

    uv run python benchmarks/install_sizes.py [--tree PATH] [--extras]

`--tree` measures another checkout (an older commit, to compare); `--extras` also installs each package with all
its extras. uv installs from its cache (hard links where it can), so nothing is downloaded twice; the sizes count
every file once, as `du` does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from smoke import parse_args

PACKAGES = [
    "nxd-config",
    "nxd-parallel",
    "nxd-precision",
    "nxd-ckpt",
    "nxd-data",
    "nxd-models",
    "nxd-align",
    "nxd-train",
]


def _run(command: list[str], cwd: Path) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={**os.environ, "VIRTUAL_ENV": ""})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)}:\n{done.stderr[-3000:]}")
    return done.stdout


def _size(folder: Path) -> int:
    seen, total = set(), 0
    for root, _, files in os.walk(folder):
        for name in files:
            stat = os.lstat(os.path.join(root, name))
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_size
    return total


def _extras(tree: Path, package: str) -> list[str]:
    folder = tree / ("apps" if package == "nxd-train" else "packages") / package
    return sorted(tomllib.loads((folder / "pyproject.toml").read_text())["project"].get("optional-dependencies", {}))


def installed(tree: Path, package: str, wheels: Path, work: Path, extras: list[str]) -> tuple[int, int]:
    """(bytes of site-packages, distributions) of `package` with `extras` installed alone."""
    venv = work / f"{package}-{'-'.join(extras) or 'core'}"
    python = venv / "bin" / "python"
    lock = work / f"pylock.{venv.name}.toml"
    chosen = [item for extra in extras for item in ("--extra", extra)]
    _run(
        [
            "uv",
            "export",
            "--frozen",
            "--quiet",
            "--package",
            package,
            "--no-emit-workspace",
            "--no-dev",
            *chosen,
            "--format",
            "pylock.toml",
            "--output-file",
            str(lock),
        ],
        tree,
    )
    _run(["uv", "venv", "--quiet", "--python", sys.executable, str(venv)], work)
    _run(["uv", "pip", "install", "--quiet", "--offline", "--python", str(python), "-r", str(lock)], work)
    target = f"{package}[{','.join(extras)}]" if extras else package
    _run(
        ["uv", "pip", "install", "--quiet", "--offline", "--python", str(python), "--find-links", str(wheels), target],
        work,
    )
    count = len(_run(["uv", "pip", "list", "--python", str(python), "--format", "freeze"], work).splitlines())
    site = next((venv / "lib").glob("python*/site-packages"))
    return _size(site), count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--extras", action="store_true")
    parser.add_argument("--packages", default=",".join(PACKAGES))
    args = parse_args(parser, packages="nxd-config")
    tree, packages = args.tree.resolve(), args.packages.split(",")
    commit = _run(["git", "rev-parse", "--short", "HEAD"], tree).strip()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        wheels = work / "wheels"
        built = ["--all-packages"] if packages == PACKAGES else [f"--package={package}" for package in packages]
        for which in built:
            _run(["uv", "build", which, "--wheel", "--quiet", "--out-dir", str(wheels)], tree)
        print(f"{tree} at {commit}; python {sys.version.split()[0]}\n")
        extra = " with every extra (MB) |" if args.extras else ""
        print("| package | installed alone (MB) | distributions |" + extra)
        print("|---|---:|---:|" + ("---:|" if args.extras else ""))
        for package in packages:
            size, count = installed(tree, package, wheels, work, [])
            row = f"| {package} | {size / 1e6:,.0f} | {count} |"
            if args.extras and (extras := _extras(tree, package)):
                row += f" {installed(tree, package, wheels, work, extras)[0] / 1e6:,.0f} |"
            elif args.extras:
                row += " |"
            print(row, flush=True)


if __name__ == "__main__":
    main()
