"""`nxd-train launch`: the job a cluster runs (an sbatch script or each host's torchrun command), checked for its
layout first, written to a new file and submitted when asked."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from nxd_config import ConfigNotice

from nxd_train.commands.support import load, names, notices_to_stderr


def run(args: argparse.Namespace) -> int:
    """Check the job for its layout, write its script (never over a file that exists), submit it if asked."""
    files, overrides = args.files, args.overrides
    config = load(files, overrides, args.dialect)
    if config is None:
        return 1
    path = names(files)
    from nxd_train.checks.memory import memory_report
    from nxd_train.checks.preflight import PreflightError, plan_run
    from nxd_train.cluster.scripts import LaunchError, host_commands, sbatch_script, unread_keys
    from nxd_train.run.corpus import default_cache_dir

    try:
        with notices_to_stderr():
            plan = plan_run(config, default_cache_dir(), here=False)
            for notice in unread_keys(config):
                warnings.warn(notice, ConfigNotice, stacklevel=1)
        report, fits = memory_report(plan, args.device_memory)
        if not fits:
            print(f"{path}: {report}", file=sys.stderr)
            return 1
        hosts = config.trainer.cluster.scheduler == "hosts"
        script = (host_commands if hosts else sbatch_script)(config, files, overrides, args.dialect)
    except PreflightError as error:
        print(f"{path}: would stop the job:\n" + "\n".join(f"  {p}" for p in error.problems), file=sys.stderr)
        return 1
    except LaunchError as error:
        print(f"{path}: {error}", file=sys.stderr)
        return 1
    if hosts and args.submit:
        print(
            "nxd-train launch: --submit submits an sbatch script; run the hosts script it wrote instead",
            file=sys.stderr,
        )
        return 1
    name = config.trainer.cluster.job_name or config.name
    output = args.output or Path(f"{name}-hosts.sh" if hosts else f"{name}.sbatch")
    try:
        with open(output, "x") as handle:  # never over a file the user has
            handle.write(script)
    except FileExistsError:
        print(
            f"--output: {output} exists; expected a new file (nxd-train never replaces one): name another",
            file=sys.stderr,
        )
        return 1
    except OSError as error:
        print(f"--output: cannot write {output} ({error.strerror or error})", file=sys.stderr)
        return 1
    output.chmod(0o755)
    layout = f"{config.trainer.num_nodes} node(s) x {config.trainer.devices} process(es)"
    print(f"wrote {output}: {layout}; {report.splitlines()[0]}")
    if not args.submit:
        return 0
    import shutil
    import subprocess

    if shutil.which("sbatch") is None:
        print(
            "--submit: sbatch is not on this machine's PATH; submit the script from a Slurm login node", file=sys.stderr
        )
        return 1
    result = subprocess.run(["sbatch", "--parsable", str(output)], capture_output=True, text=True)
    if result.returncode:
        print(f"--submit: sbatch refused {output}: {result.stderr.strip()}", file=sys.stderr)
        return 1
    print(f"submitted job {result.stdout.strip().split(';')[0]}")
    return 0
