"""`nxd-train plot`: the picture of runs' metrics (`logging.plot`)."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from nxd_train.logging.plot import plot_command

    return plot_command(args.runs, args.output)
