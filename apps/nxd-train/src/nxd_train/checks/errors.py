"""The error every check before launch raises: all its problems at once."""

from __future__ import annotations


class PreflightError(Exception):
    """Problems found before launch, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("cannot train this config:\n" + "\n".join(f"  {problem}" for problem in problems))
