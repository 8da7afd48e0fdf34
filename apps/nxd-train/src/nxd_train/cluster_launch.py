"""`nxd-train launch`: the job a cluster runs, written from the run's config (trainer.devices, num_nodes,
trainer.cluster, the requeue signal): an sbatch script whose srun starts one task per process, or, for
a DeepSpeed-style hostfile (GPT-NeoX's launcher keys), the torchrun command of each host."""

from __future__ import annotations

import re
import shlex
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from nxd_config import NxdConfig


class LaunchError(Exception):
    """The launch settings cannot make a job; the message names the key or file."""


@dataclass(frozen=True)
class Host:
    name: str
    slots: tuple[int, ...]
    """The slot (device) numbers of this host that the job uses."""


def read_hostfile(path: Path) -> list[Host]:
    """DeepSpeed's hostfile: 'HOST slots=N' a line, '#' comments; a LaunchError naming the line otherwise."""
    try:
        text = path.read_text()
    except OSError as error:
        raise LaunchError(f"trainer.cluster.hostfile: cannot read {path} ({error.strerror or error})") from None
    hosts: dict[str, Host] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\d+)", line)
        if match is None or int(match.group(2)) < 1:
            raise LaunchError(f"{path}:{number}: expected 'HOST slots=N' with N >= 1, found {line!r}")
        if match.group(1) in hosts:
            raise LaunchError(f"{path}:{number}: host {match.group(1)!r} is listed twice")
        hosts[match.group(1)] = Host(match.group(1), tuple(range(int(match.group(2)))))
    if not hosts:
        raise LaunchError(f"trainer.cluster.hostfile: {path} lists no host")
    return list(hosts.values())


def _selection(value: str, key: str, hosts: dict[str, Host]) -> dict[str, set[int] | None]:
    """DeepSpeed's include/exclude form 'host1@host2:0,1' as host -> slots (None: all of them)."""
    chosen: dict[str, set[int] | None] = {}
    for part in value.split("@"):
        name, _, slots = part.strip().partition(":")
        if name not in hosts:
            raise LaunchError(f"trainer.cluster.{key}: {name!r} is not a host of the hostfile "
                              f"({', '.join(hosts)})")  # fmt: skip
        try:
            numbers = {int(slot) for slot in slots.split(",")} if slots else None
        except ValueError:
            raise LaunchError(f"trainer.cluster.{key}: expected slot numbers after ':', found {slots!r}") from None
        if numbers is not None and not numbers <= set(hosts[name].slots):
            raise LaunchError(f"trainer.cluster.{key}: host {name} has slots {list(hosts[name].slots)}, found "
                              f"{sorted(numbers)}")  # fmt: skip
        chosen[name] = numbers
    return chosen


def select_hosts(hosts: list[Host], include: str | None, exclude: str | None, nodes: int | None,
                 per_node: int | None) -> list[Host]:  # fmt: skip
    """The hosts and slots the job uses, as DeepSpeed's launcher picks them: include, or all but exclude, then
    the first `nodes` hosts and the first `per_node` slots of each."""
    if include and exclude:
        raise LaunchError("trainer.cluster.include and exclude: expected one of them, found both")
    by_name = {host.name: host for host in hosts}
    if include:
        picked = _selection(include, "include", by_name)
        hosts = [Host(h.name, tuple(s for s in h.slots if picked[h.name] is None or s in picked[h.name]))
                 for h in hosts if h.name in picked]  # fmt: skip
    elif exclude:
        dropped, kept = _selection(exclude, "exclude", by_name), []
        for host in hosts:
            if host.name in dropped and dropped[host.name] is None:
                continue  # the whole host
            slots = tuple(s for s in host.slots if s not in (dropped.get(host.name) or set()))
            if slots:
                kept.append(Host(host.name, slots))
        hosts = kept
    if nodes is not None:
        if nodes > len(hosts):
            raise LaunchError(f"trainer.num_nodes: {nodes}, but the hostfile leaves {len(hosts)} host(s)")
        hosts = hosts[:nodes]
    if per_node is not None:
        short = [h.name for h in hosts if len(h.slots) < per_node]
        if short:
            raise LaunchError(f"trainer.devices: {per_node} per node, but {', '.join(short)} has fewer slots")
        hosts = [Host(h.name, h.slots[:per_node]) for h in hosts]
    if len({len(h.slots) for h in hosts}) > 1:
        raise LaunchError("trainer.cluster.hostfile: expected the same number of slots on each host, found "
                          + ", ".join(f"{h.name} {len(h.slots)}" for h in hosts))  # fmt: skip
    return hosts


def _command(files: list[Path], overrides: list[str], dialect: str | None) -> list[str]:
    """This installation's nxd-train, with the run's files (absolute) and overrides."""
    return [sys.executable, "-m", "nxd_train", *(["--dialect", dialect] if dialect else []),
            *(str(f.absolute()) for f in files), *overrides]  # fmt: skip


def sbatch_script(cfg: NxdConfig, files: list[Path], overrides: list[str], dialect: str | None = None) -> str:
    """An sbatch script: trainer.num_nodes nodes, trainer.devices tasks on each, srun starting nxd-train."""
    c, t = cfg.trainer.cluster, cfg.trainer
    lines = ["#!/bin/bash", f"# written by nxd-train launch for {cfg.name}: sbatch this file",
             f"#SBATCH --job-name={c.job_name or cfg.name}", f"#SBATCH --nodes={t.num_nodes}",
             f"#SBATCH --ntasks-per-node={t.devices}"]  # fmt: skip
    if c.gpus_per_node is not None:
        lines.append(f"#SBATCH --gpus-per-node={c.gpus_per_node}")
    for name in ("time", "partition", "account", "comment"):
        if (value := getattr(c, name)) is not None:
            lines.append(f"#SBATCH --{name}={shlex.quote(value)}")
    lines.append("#SBATCH --requeue" if c.requeue else "#SBATCH --no-requeue")
    if t.requeue_signal is not None:  # to every task, signal_seconds before the time limit
        lines.append(f"#SBATCH --signal={signal.Signals[t.requeue_signal].name.removeprefix('SIG')}"
                     f"@{c.signal_seconds}")  # fmt: skip
    lines += ["#SBATCH --open-mode=append", "", f"cd {shlex.quote(str(Path.cwd()))}",
              "srun --kill-on-bad-exit=1 " + shlex.join(_command(files, overrides, dialect)), ""]  # fmt: skip
    return "\n".join(lines)


def host_commands(cfg: NxdConfig, files: list[Path], overrides: list[str], dialect: str | None = None) -> str:
    """A script that starts torchrun on each host of the hostfile over ssh (or run each line on its host)."""
    c, t = cfg.trainer.cluster, cfg.trainer
    if c.hostfile is None:
        raise LaunchError("trainer.cluster.scheduler: hosts needs trainer.cluster.hostfile (GPT-NeoX: hostfile)")
    hosts = select_hosts(read_hostfile(Path(c.hostfile)), c.include, c.exclude, t.num_nodes, t.devices)
    master = c.master_addr or hosts[0].name
    lines = ["#!/bin/bash", f"# written by nxd-train launch for {cfg.name}: one torchrun a host, started over ssh",
             "set -e"]  # fmt: skip
    for rank, host in enumerate(hosts):
        visible = ",".join(map(str, host.slots))
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(hosts)), "--node-rank",
                    str(rank), "--nproc-per-node", str(len(host.slots)), "--master-addr", master, "--master-port",
                    str(c.master_port), *_command(files, overrides, dialect)[1:]]  # fmt: skip
        remote = f"cd {shlex.quote(str(Path.cwd()))} && CUDA_VISIBLE_DEVICES={visible} {shlex.join(torchrun)}"
        lines += [f"# node rank {rank}: {host.name}, slots {visible}",
                  f"ssh -o BatchMode=yes {shlex.quote(host.name)} {shlex.quote(remote)} &"]  # fmt: skip
    lines += ["wait", ""]
    return "\n".join(lines)
