"""`nxd-train launch`: the job a cluster runs, written from the run's config (trainer.devices, num_nodes,
trainer.cluster, the requeue signal): an sbatch script whose srun starts one task per process, or, for
a DeepSpeed-style hostfile (GPT-NeoX's launcher keys), the torchrun command of each host."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from nxd_config import HostfileError, NxdConfig, read_hostfile, select_hosts

NXD_HOST_KEYS = {
    "hostfile": "trainer.cluster.hostfile",
    "include": "trainer.cluster.include",
    "exclude": "trainer.cluster.exclude",
    "nodes": "trainer.num_nodes",
    "per_node": "trainer.devices",
}
"""The nxd key behind each setting a hostfile selection names."""
SCHEDULER_KEYS = {
    "slurm": ("partition", "account", "comment", "time", "gpus_per_node", "requeue", "signal_seconds", "job_name"),
    "hosts": ("hostfile", "include", "exclude", "master_addr", "master_port"),
}
"""The trainer.cluster keys each scheduler's job reads."""


class LaunchError(Exception):
    """The launch settings cannot make a job; the message names the key or file."""


def unread_keys(cfg: NxdConfig) -> list[str]:
    """trainer.cluster keys the config sets that its scheduler's job does not read, as notices."""
    c = cfg.trainer.cluster
    other = "hosts" if c.scheduler == "slurm" else "slurm"
    return [
        f"trainer.cluster.{key}: set, but a {c.scheduler} job does not read it (it is for scheduler {other})"
        for key in SCHEDULER_KEYS[other]
        if c.is_set(key)
    ]


def _command(files: list[Path], overrides: list[str], dialect: str | None) -> list[str]:
    """This installation's nxd-train, with the run's files (absolute) and overrides."""
    return [
        sys.executable,
        "-m",
        "nxd_train",
        *(["--dialect", dialect] if dialect else []),
        *(str(f.absolute()) for f in files),
        *overrides,
    ]


def _directive_value(value: str, key: str) -> str:
    """`value` as sbatch reads it back from an #SBATCH line: double-quoted, each backslash and double quote escaped
    with a backslash (sbatch's parser takes the character after a backslash as it is, inside quotes or not). The
    config admits no line break in these values (nxd-config's OneLine), so the directive stays one line. A value
    holding 'hetjob' or 'packjob' is refused: sbatch reads such a line as the start of another job component."""
    if re.search("hetjob|packjob", value, re.IGNORECASE):
        raise LaunchError(
            f"{key}: expected a value without 'hetjob' or 'packjob' (sbatch reads an #SBATCH line "
            f"holding either as the start of another job component), found {value!r}"
        )
    if re.fullmatch(r"[A-Za-z0-9_.:@%+=,/-]+", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _name_key(cfg: NxdConfig) -> str:
    return "trainer.cluster.job_name" if cfg.trainer.cluster.job_name else "name"


def sbatch_script(cfg: NxdConfig, files: list[Path], overrides: list[str], dialect: str | None = None) -> str:
    """An sbatch script: trainer.num_nodes nodes, trainer.devices tasks on each, srun starting nxd-train."""
    c, t = cfg.trainer.cluster, cfg.trainer
    lines = [
        "#!/bin/bash",
        f"# written by nxd-train launch for {cfg.name}: sbatch this file",
        f"#SBATCH --job-name={_directive_value(c.job_name or cfg.name, _name_key(cfg))}",
        f"#SBATCH --nodes={t.num_nodes}",
        f"#SBATCH --ntasks-per-node={t.devices}",
    ]
    if c.gpus_per_node is not None:
        lines.append(f"#SBATCH --gpus-per-node={c.gpus_per_node}")
    for name in ("time", "partition", "account", "comment"):
        if (value := getattr(c, name)) is not None:
            lines.append(f"#SBATCH --{name}={_directive_value(value, f'trainer.cluster.{name}')}")
    lines.append("#SBATCH --requeue" if c.requeue else "#SBATCH --no-requeue")
    if t.requeue_signal is not None:  # to every task, signal_seconds before the time limit
        lines.append(f"#SBATCH --signal={t.requeue_signal.removeprefix('SIG')}@{c.signal_seconds}")
    lines += [
        "#SBATCH --open-mode=append",
        "",
        f"cd {shlex.quote(str(Path.cwd()))}",
        "srun --kill-on-bad-exit=1 " + shlex.join(_command(files, overrides, dialect)),
        "",
    ]
    return "\n".join(lines)


def host_commands(cfg: NxdConfig, files: list[Path], overrides: list[str], dialect: str | None = None) -> str:
    """A script that starts torchrun on each host of the hostfile over ssh (or run each line on its host)."""
    c, t = cfg.trainer.cluster, cfg.trainer
    if c.hostfile is None:
        raise LaunchError(
            "trainer.cluster.hostfile: expected a DeepSpeed hostfile for scheduler hosts (GPT-NeoX: "
            "hostfile), found none"
        )
    try:
        hosts = select_hosts(read_hostfile(Path(c.hostfile)), c.include, c.exclude, t.num_nodes, t.devices)
    except HostfileError as error:
        raise LaunchError(f"{NXD_HOST_KEYS[error.key]}: {error.message}") from None
    master = c.master_addr or hosts[0].name
    lines = [
        "#!/bin/bash",
        f"# written by nxd-train launch for {cfg.name}: one torchrun a host, started over ssh;",
        "# exits 1 naming each host whose command failed",
        "hosts=() pids=()",
    ]
    for rank, host in enumerate(hosts):
        visible = ",".join(map(str, host.slots))
        torchrun = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(len(hosts)),
            "--node-rank",
            str(rank),
            "--nproc-per-node",
            str(len(host.slots)),
            "--master-addr",
            master,
            "--master-port",
            str(c.master_port),
            *_command(files, overrides, dialect)[1:],
        ]
        remote = f"cd {shlex.quote(str(Path.cwd()))} && CUDA_VISIBLE_DEVICES={visible} {shlex.join(torchrun)}"
        lines += [
            f"# node rank {rank}: {host.name}, slots {visible}",  # '--': the host is never an ssh option
            f"ssh -o BatchMode=yes -- {shlex.quote(host.name)} {shlex.quote(remote)} &",
            f"hosts+=({shlex.quote(host.name)}) pids+=($!)",
        ]
    lines += [
        "failed=0",
        'for i in "${!pids[@]}"; do',
        '  wait "${pids[$i]}" || { status=$?; echo "nxd-train launch: node rank $i (${hosts[$i]}) exited with'
        ' $status" >&2; failed=1; }',
        "done",
        'exit "$failed"',
        "",
    ]
    return "\n".join(lines)
