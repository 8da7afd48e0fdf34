"""nxd_ckpt."""

__version__ = "0.1.0"
