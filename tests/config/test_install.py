"""`pip install packages/nxd-config` into an empty virtualenv brings no torch."""

import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "packages" / "nxd-config"


def test_isolated_install_pulls_no_torch(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(PACKAGE)], check=True, timeout=600)
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"], check=True,
                            capture_output=True, text=True).stdout.lower()
    assert "nxd-config==0.2.0" in listed or "nxd_config==0.2.0" in listed
    assert "torch" not in listed
    out = subprocess.run([str(python), "-c", "import nxd_config, sys; print('torch' in sys.modules)"],
                         check=True, capture_output=True, text=True).stdout.strip()
    assert out == "False"


def test_each_package_requires_only_what_the_dependency_rule_allows() -> None:
    """DESIGN.md's rule, read from each pyproject.toml: optional extras (Adafactor, chat templates) aside,
    nxd-parallel and nxd-precision need torch alone and no package but nxd-models pulls transformers."""
    import re
    import tomllib

    def required(package: str) -> set[str]:
        project = tomllib.loads((PACKAGE.parent / package / "pyproject.toml").read_text())["project"]
        return {re.split(r"[<>=\[ ]", dependency)[0] for dependency in project["dependencies"]}

    assert required("nxd-parallel") == {"torch"}
    assert required("nxd-precision") == {"torch"}
    assert required("nxd-models") == {"torch", "transformers"}
    assert "transformers" not in required("nxd-data") | required("nxd-align") | required("nxd-ckpt")
    assert not {name for name in required("nxd-align") if name.startswith("nxd-")} - {"nxd-models"}
