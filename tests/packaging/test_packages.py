"""Each package as a release: `uv build --all-packages` (what the release workflow runs) makes its sdist and its
wheel from that sdist; the wheel installs alone into a fresh virtualenv with only the nxd packages it declares
(found in the folder of freshly built distributions, as they would be on PyPI), the extras its README's example
names and the locked third-party versions, imports its whole public API, and runs every ```python block of its
README there, as written, in an empty folder; nxd-config also installs from its sdist alone. Nothing is
downloaded: uv installs from its cache, which the project's own install filled.

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
PACKAGES = {
    "nxd-config": "packages",
    "nxd-parallel": "packages",
    "nxd-precision": "packages",
    "nxd-ckpt": "packages",
    "nxd-data": "packages",
    "nxd-models": "packages",
    "nxd-align": "packages",
    "nxd-train": "apps",
}
TIMEOUT = 900
BUILD = ["build", "--all-packages", "--out-dir", "dist"]
"""The release workflow's build (sdists, then wheels from them), into `dist` under the folder it runs in."""
README_EXTRAS = {"nxd-models": "hf", "nxd-align": "lora"}
"""The extras a package's README example uses (its README says to install them)."""


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
    return subprocess.run(
        command,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **env},
    )


def _fresh_venv(package: str, work: Path, extra: str | None = None) -> Path:
    """A new virtualenv under `work` holding the locked third-party versions `package` (with `extra`) needs, nothing
    else; returns its python."""
    uv, module = _uv(), package.replace("-", "_")
    venv, python = work / "venv", work / "venv" / "bin" / "python"
    lock = work / f"pylock.{module}.toml"
    for step in (
        [
            uv,
            "export",
            "--frozen",
            "--quiet",
            "--package",
            package,
            "--no-emit-workspace",
            "--no-dev",
            *(["--extra", extra] if extra else []),
            "--format",
            "pylock.toml",
            "--output-file",
            str(lock),
        ],
        [uv, "venv", "--quiet", "--python", sys.executable, str(venv)],
        [uv, "pip", "install", "--quiet", "--offline", "--python", str(python), "-r", str(lock)],
    ):
        done = _run(step, ROOT if step[1] == "export" else work, VIRTUAL_ENV="")
        assert done.returncode == 0, f"{' '.join(step)}:\n{done.stderr}"
    return python


def _install_and_run(package: str, wheels: Path, work: Path) -> Installed:
    uv, module = _uv(), package.replace("-", "_")
    venv, extra = work / "venv", README_EXTRAS.get(package)
    python = _fresh_venv(package, work, extra)
    step = [
        uv,
        "pip",
        "install",
        "--quiet",
        "--offline",
        "--python",
        str(python),
        "--find-links",
        str(wheels),
        f"{package}[{extra}]" if extra else package,
    ]
    done = _run(step, work, VIRTUAL_ENV="")
    assert done.returncode == 0, f"{' '.join(step)}:\n{done.stderr}"
    listed = _run([uv, "pip", "list", "--python", str(python), "--format", "json"], work)
    distributions = {entry["name"]: entry["version"] for entry in json.loads(listed.stdout)}
    api = _run(
        [
            str(python),
            "-c",
            f"import {module} as m; names = getattr(m, '__all__', []); "
            f"[getattr(m, name) for name in names]; print(m.__version__, len(names))",
        ],
        work,
    )
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
    """Every package's sdist and wheel, built from a copy of this tree's tracked files (as a clone holds them) by the
    release workflow's command."""
    tree = tmp_path_factory.mktemp("tree")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source, target = ROOT / name, tree / name
        if source.exists() or source.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    built = _run([_uv(), *BUILD], tree)
    assert built.returncode == 0, built.stderr
    return tree / "dist"


def test_the_release_build_makes_each_package_an_sdist_and_a_wheel(wheels: Path) -> None:
    workflow = (ROOT / ".github" / "workflows" / "release.yml").read_text()
    assert f"uv {' '.join(BUILD)}\n" in workflow  # the release publishes what this test built
    for package in PACKAGES:
        module, version = package.replace("-", "_"), declared(package)["version"]
        assert (wheels / f"{module}-{version}.tar.gz").is_file()
        assert (wheels / f"{module}-{version}-py3-none-any.whl").is_file()


def test_a_package_installs_from_its_sdist_alone(wheels: Path, tmp_path: Path) -> None:
    """nxd-config's sdist (no torch) built into a fresh virtualenv: it imports, and its LICENSE travels with it."""
    python = _fresh_venv("nxd-config", tmp_path)
    sdist = wheels / f"nxd_config-{declared('nxd-config')['version']}.tar.gz"
    step = [
        _uv(),
        "pip",
        "install",
        "--quiet",
        "--offline",
        "--python",
        str(python),
        "--no-binary",
        "nxd-config",
        str(sdist),
    ]
    done = _run(step, tmp_path, VIRTUAL_ENV="")
    assert done.returncode == 0, f"{' '.join(step)}:\n{done.stderr}"
    program = (
        "import nxd_config, importlib.metadata as m; "
        "print(nxd_config.__version__, *m.distribution('nxd-config').read_text('licenses/LICENSE').split()[:2])"
    )
    imported = _run([str(python), "-c", program], tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.split() == [declared("nxd-config")["version"], "Apache", "License"]


ALONE = [pytest.param(package, marks=() if package == "nxd-config" else pytest.mark.slow) for package in PACKAGES]


@pytest.mark.parametrize("package", ALONE)
def test_each_package_installs_alone_and_runs_its_readme(package: str, wheels: Path, tmp_path: Path) -> None:
    result = _install_and_run(package, wheels, tmp_path)
    version = declared(package)["version"]
    assert result.api.split()[0] == version
    nxd = {name for name in result.distributions if name.startswith("nxd-")}
    siblings = {
        re.split(r"[\[<>=]", requirement)[0]
        for requirement in declared(package)["dependencies"]
        if requirement.startswith("nxd-")
    }
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
    print(
        f"{package} {version}: {len(result.distributions)} distributions ({', '.join(sorted(nxd))}); public API "
        f"{result.api.split()[1]} names; README blocks run: {len(result.blocks)}"
    )


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=\[ ;]", requirement)[0] for requirement in requirements}


def test_each_package_requires_only_what_the_dependency_rule_allows() -> None:
    """DESIGN.md's rule, read from each pyproject.toml: a package requires what its core API needs, the rest are
    extras named after what they enable (nxd-train requires the extras it uses); nxd-parallel, nxd-precision and
    nxd-models need torch alone, nxd-align needs nxd-models only of nxd, every nxd requirement is a compatible range
    (`>=0.2,<0.3`), never a bare name, and transformers has one lower bound wherever it is named."""

    def required(package: str) -> set[str]:
        return _names(declared(package)["dependencies"])

    def extra(package: str, name: str) -> set[str]:
        return _names(declared(package)["optional-dependencies"][name])

    assert required("nxd-parallel") == required("nxd-precision") == required("nxd-models") == {"torch"}
    assert extra("nxd-models", "hf") == {"transformers"}
    assert extra("nxd-data", "hf") == {"datasets", "pyarrow"} and not {"datasets", "pyarrow"} & required("nxd-data")
    assert extra("nxd-align", "lora") == {"peft"} and "peft" not in required("nxd-align")
    assert "transformers" not in required("nxd-data") | required("nxd-align") | required("nxd-ckpt")
    assert {name for name in required("nxd-align") if name.startswith("nxd-")} == {"nxd-models"}
    train = declared("nxd-train")["dependencies"]
    for needed in ("nxd-models[hf]", "nxd-data[hf,", "nxd-align[lora]", "nxd-precision[adafactor,schedules]"):
        assert any(requirement.startswith(needed) for requirement in train), needed
    bounds = {
        re.sub(r";.*", "", requirement).strip()
        for package in PACKAGES
        for requirements in [
            declared(package)["dependencies"],
            *declared(package).get("optional-dependencies", {}).values(),
        ]
        for requirement in requirements
        if _names([requirement]) == {"transformers"}
    }
    assert bounds == {"transformers>=5.0"}
    for package in PACKAGES:
        for requirement in declared(package)["dependencies"]:
            if requirement.startswith("nxd-"):
                assert re.fullmatch(r"nxd-[a-z]+(\[[a-z,]+\])?>=0\.2,<0\.3", requirement), requirement


def test_no_tracked_link_lies_inside_a_package() -> None:
    """A package's sdist takes its folder as it is: a link in it (to the repository's LICENSE, to a config folder)
    points outside the unpacked archive, which uv refuses, or loops."""
    listed = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    links = [line.split("\t", 1)[1] for line in listed.splitlines() if line.startswith("120000 ")]
    assert not [link for link in links if link.startswith(("packages/", "apps/"))], links


def test_every_package_carries_its_version_changelog_license_and_types() -> None:
    """A real LICENSE in each package (an sdist holding a link out of itself cannot be unpacked), the same text as
    the repository's; classifiers for the Python versions requires-python admits, the topic and typing; the project
    links. The license itself is the SPDX `license` field (PEP 639), which replaces license classifiers."""
    for package, folder in PACKAGES.items():
        home = ROOT / folder / package
        version = declared(package)["version"]
        assert f"## [{version}]" in (home / "CHANGELOG.md").read_text()
        assert not (home / "LICENSE").is_symlink()
        assert (home / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
        project = declared(package)
        assert project["license"] == "Apache-2.0" and project["requires-python"] == ">=3.11"
        classifiers = set(project["classifiers"])
        assert {
            "Programming Language :: Python :: 3.11",
            "Programming Language :: Python :: 3.12",
            "Typing :: Typed",
            "Topic :: Scientific/Engineering :: Artificial Intelligence",
        } <= classifiers
        assert not any(classifier.startswith("License ::") for classifier in classifiers)
        assert set(project["urls"]) == {"Homepage", "Documentation", "Repository", "Issues", "Changelog"}
        assert project["urls"]["Changelog"].endswith(f"/{folder}/{package}/CHANGELOG.md")
        assert (home / "src" / package.replace("-", "_") / "py.typed").is_file()
        assert __import__(package.replace("-", "_")).__version__ == version
