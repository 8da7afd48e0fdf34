"""Each package as a release: its wheel builds, installs alone into a fresh virtualenv with only the nxd packages it
declares (found in the folder of freshly built wheels, as they would be on PyPI) and the locked third-party
versions, imports its whole public API, and runs every ```python block of its README there, as written, in an
empty folder. Nothing is downloaded: uv installs from its cache, which the project's own install filled.

A fresh environment imports torch and transformers from cold (20-90 s a package here), so the default suite
installs nxd-config (the one without torch) and the slow set every package; CI's packaging job runs them all."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"nxd-config": "packages", "nxd-parallel": "packages", "nxd-precision": "packages", "nxd-ckpt": "packages",
            "nxd-data": "packages", "nxd-models": "packages", "nxd-align": "packages", "nxd-train": "apps"}
TIMEOUT = 900


def readme_programs(package: str) -> list[str]:
    """The ```python blocks of a package's README, in order."""
    readme = (ROOT / PACKAGES[package] / package / "README.md").read_text()
    return re.findall(r"^```python\n(.*?)^```$", readme, flags=re.S | re.M)


def declared(package: str) -> dict:
    return tomllib.loads((ROOT / PACKAGES[package] / package / "pyproject.toml").read_text())["project"]


@dataclass
class Installed:
    package: str
    distributions: dict[str, str]  # name -> version in the fresh environment
    api: str  # what importing the public API printed
    blocks: list[tuple[int, subprocess.CompletedProcess]]  # each README block's run


def _uv() -> str:
    found = os.environ.get("UV") or shutil.which("uv")
    assert found, "uv is needed to build and install the wheels (the README's `uv run pytest` provides it)"
    return found


def _run(command: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", **env})  # fmt: skip


def _install_and_run(package: str, wheels: Path, work: Path) -> Installed:
    uv, module = _uv(), package.replace("-", "_")
    venv, python = work / "venv", work / "venv" / "bin" / "python"
    lock = work / f"pylock.{module}.toml"  # the locked third-party versions this package needs, nothing else
    for step in ([uv, "export", "--frozen", "--quiet", "--package", package, "--no-emit-workspace", "--no-dev",
                  "--format", "pylock.toml", "--output-file", str(lock)],
                 [uv, "venv", "--quiet", "--python", sys.executable, str(venv)],
                 [uv, "pip", "install", "--quiet", "--offline", "--python", str(python), "-r", str(lock)],
                 [uv, "pip", "install", "--quiet", "--offline", "--python", str(python), "--find-links", str(wheels),
                  package]):  # fmt: skip
        done = _run(step, ROOT if step[1] == "export" else work, VIRTUAL_ENV="")
        assert done.returncode == 0, f"{' '.join(step)}:\n{done.stderr}"
    listed = _run([uv, "pip", "list", "--python", str(python), "--format", "json"], work)
    distributions = {entry["name"]: entry["version"] for entry in json.loads(listed.stdout)}
    api = _run([str(python), "-c", f"import {module} as m; names = getattr(m, '__all__', []); "
                                   f"[getattr(m, name) for name in names]; print(m.__version__, len(names))"],
               work)  # fmt: skip
    assert api.returncode == 0, api.stderr
    if package == "nxd-train":  # the command its wheel installs, with the example configs it ships
        for command in (["--version"], ["config", "list"]):
            ran = _run([str(venv / "bin" / "nxd-train"), *command], work)
            assert ran.returncode == 0 and ran.stdout, ran.stderr
    blocks = []
    for index, program in enumerate(readme_programs(package)):
        folder = work / f"block{index}"
        folder.mkdir()
        (folder / "example.py").write_text(program)
        blocks.append((index, _run([str(python), "example.py"], folder)))
    return Installed(package, distributions, api.stdout.strip(), blocks)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every package's wheel, built from this tree."""
    folder = tmp_path_factory.mktemp("wheels")
    built = _run([_uv(), "build", "--all-packages", "--wheel", "--quiet", "--out-dir", str(folder)], ROOT)
    assert built.returncode == 0, built.stderr
    return folder


ALONE = [pytest.param(package, marks=() if package == "nxd-config" else pytest.mark.slow) for package in PACKAGES]


@pytest.mark.parametrize("package", ALONE)
def test_each_package_installs_alone_and_runs_its_readme(package: str, wheels: Path, tmp_path: Path) -> None:
    result = _install_and_run(package, wheels, tmp_path)
    version = declared(package)["version"]
    assert result.api.split()[0] == version
    nxd = {name for name in result.distributions if name.startswith("nxd-")}
    siblings = {re.split(r"[\[<>=]", requirement)[0] for requirement in declared(package)["dependencies"]
                if requirement.startswith("nxd-")}  # fmt: skip
    transitive = {"nxd-align": {"nxd-models"}}.get(package, set())
    assert nxd == {package} | siblings | transitive, f"{package} pulled {sorted(nxd)}"
    assert all(result.distributions[name] == declared(name)["version"] for name in nxd)
    if package == "nxd-config":
        assert not {"torch", "transformers"} & set(result.distributions)  # a config reader without torch
    if package in ("nxd-parallel", "nxd-precision"):
        assert "transformers" not in result.distributions and "lightning-fabric" not in result.distributions
    programs = readme_programs(package)
    assert programs, f"{package}'s README has no python example"
    for index, run in result.blocks:
        assert run.returncode == 0, f"{package} README block {index + 1}:\n{programs[index]}\n{run.stderr[-3000:]}"
    print(f"{package} {version}: {len(result.distributions)} distributions ({', '.join(sorted(nxd))}); public API "
          f"{result.api.split()[1]} names; README blocks run: {len(result.blocks)}")


def test_each_package_requires_only_what_the_dependency_rule_allows() -> None:
    """DESIGN.md's rule, read from each pyproject.toml: optional extras aside, nxd-parallel and nxd-precision need
    torch alone, no package but nxd-models pulls transformers, nxd-align needs nxd-models only of nxd, and every
    nxd requirement is a compatible range (`>=0.2,<0.3`), never a bare name."""
    def required(package: str) -> set[str]:
        return {re.split(r"[<>=\[ ]", dependency)[0] for dependency in declared(package)["dependencies"]}

    assert required("nxd-parallel") == {"torch"}
    assert required("nxd-precision") == {"torch"}
    assert required("nxd-models") == {"torch", "transformers"}
    assert "transformers" not in required("nxd-data") | required("nxd-align") | required("nxd-ckpt")
    assert {name for name in required("nxd-align") if name.startswith("nxd-")} == {"nxd-models"}
    for package in PACKAGES:
        for requirement in declared(package)["dependencies"]:
            if requirement.startswith("nxd-"):
                assert re.fullmatch(r"nxd-[a-z]+(\[[a-z,]+\])?>=0\.2,<0\.3", requirement), requirement


def test_every_package_carries_its_version_changelog_license_and_types() -> None:
    for package, folder in PACKAGES.items():
        home = ROOT / folder / package
        version = declared(package)["version"]
        assert f"## [{version}]" in (home / "CHANGELOG.md").read_text()
        assert (home / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
        assert (home / "src" / package.replace("-", "_") / "py.typed").is_file()
        assert __import__(package.replace("-", "_")).__version__ == version
