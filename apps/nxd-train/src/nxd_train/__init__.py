"""nxd_train."""

from importlib.metadata import version as _distribution_version

__version__ = _distribution_version("nxd-train")  # one source: the pyproject's version
