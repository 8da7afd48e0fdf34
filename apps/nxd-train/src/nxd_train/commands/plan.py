"""`nxd-train plan`: each rank's memory for the config's layout, against the memory a rank has."""

from __future__ import annotations

import argparse
import sys

from nxd_train.commands.support import load, names, notices_to_stderr


def run(args: argparse.Namespace) -> int:
    config = load(args.files, args.overrides, args.dialect)
    if config is None:
        return 1
    path = names(args.files)
    from nxd_train.checks.memory import memory_report
    from nxd_train.checks.preflight import PreflightError, plan_run
    from nxd_train.run.corpus import default_cache_dir

    try:
        with notices_to_stderr():
            plan = plan_run(config, default_cache_dir(), data_required=False, here=False)
    except PreflightError as error:
        print(f"{path}: {error}", file=sys.stderr)
        return 1
    report, fits = memory_report(plan, args.device_memory)
    print(f"{path}: {report}")
    return 0 if fits else 1
