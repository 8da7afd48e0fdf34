"""The one error type nxd-models raises for a model that cannot be built as asked."""

from __future__ import annotations


class ModelConfigError(ValueError):
    """A model description that cannot be built: one problem per entry of `problems`, each naming the
    key or file, what was expected and what was found."""

    def __init__(self, *problems: str):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))
