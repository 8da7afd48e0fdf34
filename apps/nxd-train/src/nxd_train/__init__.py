"""nxd_train."""

__version__ = "0.1.0"
