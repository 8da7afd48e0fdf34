"""The one error type nxd-parallel raises for a layout or plan it cannot apply."""

from __future__ import annotations


class ParallelConfigError(ValueError):
    """A parallel layout, plan or checkpointing request that cannot be applied; `.problems` lists each."""

    def __init__(self, *problems: str):
        self.problems = list(problems)
        super().__init__("\n".join(problems))
