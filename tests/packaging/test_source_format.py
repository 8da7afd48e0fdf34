"""The tree is formatted by `ruff format` (the project's rule, not a choice per line): a change that is not formatted
fails here as well as in CI's format check, and the escape hatches stay rare."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP = "# fmt:" + " skip"  # spelled apart, so that this file holds no marker itself
MOST_SKIPS = 50  # a skip marker is for a line whose layout carries meaning; key tables use one fmt: off/on block


def _tracked_python() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / name for name in listed.stdout.split()]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git checkout")
def test_the_tree_is_formatted_by_ruff_with_few_exceptions():
    ruff = shutil.which("ruff")
    assert ruff, "ruff is in the dev group: run the tests through `uv run pytest`"
    check = subprocess.run([ruff, "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    skips = {str(path.relative_to(ROOT)): path.read_text().count(SKIP) for path in _tracked_python()}
    assert sum(skips.values()) <= MOST_SKIPS, sorted((n, p) for p, n in skips.items() if n)[-10:]
    for path in _tracked_python():
        text = path.read_text()
        assert text.count("# fmt: off") == text.count("# fmt: on") <= 1, path
