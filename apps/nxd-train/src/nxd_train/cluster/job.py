"""The launcher job a process belongs to (torchrun's, Slurm's, mpirun's): the same id in every round, and which
round this is."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nxd_parallel import LaunchWorld

LAUNCHER_NAMES = {"torchrun": "torchrun", "slurm": "Slurm", "mpi": "mpirun", "env": "the env:// variables"}


@dataclass(frozen=True)
class Job:
    """The launcher job a process belongs to: the same `job_id` in every round, `restart` counting the rounds."""

    launcher: str
    job_id: str
    restart: int

    @property
    def tag(self) -> str:
        """What a log directory records of the job that holds it."""
        return f"{self.launcher} {self.job_id}"

    def says(self) -> str:
        """'torchrun restart 2 of job X' / 'Slurm requeue 1 of job 4711', for the run's lines."""
        again = "requeue" if self.launcher == "slurm" else "restart"
        return f"{LAUNCHER_NAMES[self.launcher]} {again} {self.restart} of job {self.job_id}"


def job_of(world: LaunchWorld | None, environ: Mapping[str, str]) -> Job | None:
    """The launcher's job: its world's, or a Slurm batch job whose script runs nxd-train itself (no srun)."""
    if world is not None and world.job_id is not None:
        return Job(world.launcher, world.job_id, world.restart)
    if world is None and "SLURM_JOB_ID" in environ:
        restart = environ.get("SLURM_RESTART_COUNT", "0")
        return Job("slurm", environ["SLURM_JOB_ID"], int(restart) if restart.isdigit() else 0)
    return None
