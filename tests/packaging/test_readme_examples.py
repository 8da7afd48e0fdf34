"""Every ```python block of the package READMEs runs as written, in an empty folder, here in the development
environment (tests/packaging/test_packages.py runs each again in its package's own fresh environment), and each
package's public API is what its README's API table lists."""

from __future__ import annotations

import importlib
import re
import runpy
from pathlib import Path

import pytest

from tests.packaging.test_packages import PACKAGES, ROOT, readme_programs

BLOCKS = [
    pytest.param(package, index, id=f"{package}-{index + 1}")
    for package in PACKAGES
    for index in range(len(readme_programs(package)))
]


def test_every_package_readme_has_an_example_and_together_they_cover_all_seven() -> None:
    covered = {package for package, _ in (param.values for param in BLOCKS)}
    assert covered == set(PACKAGES)
    for package in PACKAGES:  # each block uses its own package, and of nxd only what the package requires
        allowed = {package.replace("-", "_")} | ({"nxd_models"} if package == "nxd-align" else set())
        for program in readme_programs(package):
            used = set(re.findall(r"^(?:from|import) (nxd_\w+)", program, flags=re.M))
            assert package.replace("-", "_") in used and used <= allowed, (package, used)


@pytest.mark.parametrize(("package", "index"), BLOCKS)
def test_readme_block_runs_as_written(package: str, index: int, tmp_path: Path, monkeypatch, capsys) -> None:
    program = readme_programs(package)[index]
    script = tmp_path / "example.py"
    script.write_text(program)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")
    print(f"ran {package} README block {index + 1} ({len(program.splitlines())} lines)")


@pytest.mark.parametrize("package", [name for name in PACKAGES if name != "nxd-train"])
def test_the_readme_api_table_is_the_public_api(package: str) -> None:
    """`__all__` holds what the README documents, one row each, and every name imports."""
    readme = (ROOT / PACKAGES[package] / package / "README.md").read_text()
    table = readme.split("<!-- api:start -->")[1].split("<!-- api:end -->")[0]
    listed = re.findall(r"^\| `(\w+)` \|", table, flags=re.M)
    module = importlib.import_module(package.replace("-", "_"))
    assert listed == list(module.__all__)
    assert all(hasattr(module, name) for name in listed)
