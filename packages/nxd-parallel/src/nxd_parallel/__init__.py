"""nxd_parallel."""

__version__ = "0.1.0"
