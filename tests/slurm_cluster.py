"""A real Slurm cluster of one node on this host, for tests: Debian's slurm-wlm and munge, a slurm.conf
written for this machine (its cores, process tracking by /proc, no task plugin), state and spool under
a temporary folder, `munged`, `slurmctld` and `slurmd` started and stopped by their pids.

Run it by hand to try nxd under Slurm: `python -m tests.slurm_cluster DIR` starts one and prints the
`SLURM_CONF` to export; Ctrl-C stops it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")


class SlurmUnavailable(Exception):
    """Slurm cannot start on this machine (not installed, not root, a daemon that will not come up)."""


@dataclass
class SlurmCluster:
    """One controller and one node daemon on this host; `env` is what a client (sbatch, srun) needs."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)
    pids: list[int] = field(default_factory=list)
    scratch: list[Path] = field(default_factory=list)
    """Folders outside `root` it made (munged's), removed when it stops."""

    def run(self, *command: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        result = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode:
            raise RuntimeError(f"{' '.join(command)}: exit {result.returncode}: {result.stderr.strip()}")
        return result

    def submit(self, script: Path, *options: str) -> str:
        """sbatch `script`; the job id."""
        return self.run("sbatch", "--parsable", *options, str(script)).stdout.strip().split(";")[0]

    def state(self, job: str) -> str:
        """The job's state as the controller has it (PENDING, RUNNING, COMPLETED, FAILED ...)."""
        out = self.run("scontrol", "show", "job", job, "-o", check=False).stdout
        for item in out.split():
            if item.startswith("JobState="):
                return item.partition("=")[2]
        return "UNKNOWN"

    def wait(
        self,
        job: str,
        timeout: float = 300,
        states: tuple[str, ...] = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"),
    ) -> str:
        """Wait until the job is in one of `states`; that state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (state := self.state(job)) in states:
                return state
            time.sleep(0.5)
        raise TimeoutError(f"job {job} still {self.state(job)} after {timeout:.0f} s")

    def stop(self) -> None:
        for pid in reversed(self.pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + 10
        for pid in self.pids:
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.pids.clear()
        for folder in self.scratch:
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _memory_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 - 1024
    return 1024


def start_cluster(root: Path, timeout: float = 30) -> SlurmCluster:
    """Start a one-node cluster whose files live under `root`; SlurmUnavailable saying why it cannot."""
    missing = [name for name in DAEMONS if shutil.which(name, path="/usr/sbin:/usr/bin:/sbin") is None]
    if missing:
        raise SlurmUnavailable(f"not installed: {', '.join(missing)} (apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        raise SlurmUnavailable("slurmd runs as root here, and this user is not root")
    root.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().split(".")[0]
    for folder in ("state", "spool", "log"):
        (root / folder).mkdir(exist_ok=True)
    munge = Path(tempfile.mkdtemp(prefix="nxd-munge-"))  # munged (user munge) must reach it: not under root's 0700
    (root / "munge").unlink(missing_ok=True)
    (root / "munge").symlink_to(munge)
    conf = root / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=nxdtest",
                f"SlurmctldHost={host}",
                "AuthType=auth/munge",
                "SlurmUser=root",
                f"SlurmctldPort={_free_port()}",
                f"SlurmdPort={_free_port()}",
                f"StateSaveLocation={root / 'state'}",
                f"SlurmdSpoolDir={root / 'spool'}",
                f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                f"SlurmdPidFile={root / 'slurmd.pid'}",
                f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "MpiDefault=none",
                "ReturnToService=2",
                "SchedulerType=sched/backfill",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_CPU",
                "JobRequeue=1",
                "KillWait=10",
                "AuthInfo=cred_expire=10",
                "MinJobAge=600",
                "SlurmctldTimeout=30",
                "SlurmdTimeout=30",
                "InactiveLimit=0",
                "JobCompType=jobcomp/none",
                "JobAcctGatherType=jobacct_gather/none",
                f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={_memory_mib()} State=UNKNOWN",
                "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
            ]
        )
        + "\n"
    )
    cluster = SlurmCluster(root, env={**os.environ, "SLURM_CONF": str(conf)}, scratch=[munge])
    socket_path = munge / "munge.socket"
    munge_key = Path("/etc/munge/munge.key")
    if not munge_key.exists():
        subprocess.run(["/usr/sbin/mungekey", "--create"], check=False, capture_output=True)
    shutil.chown(munge, "munge", "munge")
    try:
        _start(
            cluster,
            [
                "runuser",
                "-u",
                "munge",
                "--",
                "/usr/sbin/munged",
                "--foreground",
                "--force",
                f"--socket={socket_path}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--seed-file={munge / 'seed'}",
                f"--log-file={munge / 'munged.log'}",
            ],
            root / "log" / "munged.out",
        )
        _wait_for(lambda: socket_path.exists(), timeout, "munged did not open its socket")
        default_socket = Path("/run/munge/munge.socket.2")  # where Slurm 22.05's auth/munge connects
        default_socket.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(default_socket):
            default_socket.unlink()
        default_socket.symlink_to(socket_path)
        env = {**os.environ, "SLURM_CONF": str(conf)}
        _start(cluster, ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(conf)], root / "log" / "slurmctld.out", env)
        _start(cluster, ["/usr/sbin/slurmd", "-D", "-f", str(conf)], root / "log" / "slurmd.out", env)
        _wait_for(
            lambda: "idle" in cluster.run("sinfo", "-h", "-o", "%T", check=False).stdout,
            timeout,
            "the node did not become idle",
        )
    except SlurmUnavailable:
        cluster.stop()
        raise
    return cluster


def _start(cluster: SlurmCluster, command: list[str], out: Path, env: dict[str, str] | None = None) -> None:
    with open(out, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    cluster.pids.append(process.pid)
    time.sleep(0.2)
    if process.poll() is not None:
        raise SlurmUnavailable(f"{command[0]} exited at once ({out.read_text().strip()[-300:]})")


def _wait_for(ready, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.3)
    raise SlurmUnavailable(what)


if __name__ == "__main__":
    cluster = start_cluster(Path(sys.argv[1]).resolve())
    print(f"export SLURM_CONF={cluster.env['SLURM_CONF']}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
