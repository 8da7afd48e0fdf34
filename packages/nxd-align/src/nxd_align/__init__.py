"""nxd_align."""

__version__ = "0.1.0"
