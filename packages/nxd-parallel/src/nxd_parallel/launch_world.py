"""The processes a launcher started, read from the variables it sets: torchrun / torchelastic, a Slurm
job step (`srun`), mpirun (Open MPI's and MPICH's) and the plain `env://` variables that Kubernetes
operators and SageMaker set. A pure function of the environment, so that the run's world is the
launcher's world and a config that disagrees can be refused before any process writes.

Lightning's own environments are stricter than Slurm (its SLURMEnvironment raises on `--ntasks`
without `--ntasks-per-node`) or need a package (mpi4py for MPI); this reads what each launcher
documents instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

SLURM_BASE_PORT = 15000
"""Slurm steps without MASTER_PORT rendezvous on 15000 + the job id's last four digits (Lightning's rule)."""


class LaunchWorldError(ValueError):
    """The launcher's variables are incomplete or inconsistent; the message names them."""


@dataclass(frozen=True)
class LaunchWorld:
    """This process's place in the processes a launcher started."""

    launcher: str
    """'torchrun', 'slurm', 'mpi' or 'env'."""
    world_size: int
    rank: int
    local_rank: int
    local_world_size: int
    """Processes on this node."""
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    restart: int = 0
    """How many times the launcher has restarted this job (torchrun's restart round, Slurm's requeue count)."""
    job_id: str | None = None
    """The same across restarts of one job (torchrun's run id, Slurm's job id); None when the launcher has none."""
    agent_store: bool = False
    """torchrun's agent serves the rendezvous store at master_addr:master_port (ranks are its clients)."""
    source: str = ""
    """The variables the sizes came from, for messages."""

    @property
    def single_host(self) -> bool:
        """Every process is on this host."""
        return self.num_nodes == 1


def launch_world(environ: Mapping[str, str]) -> LaunchWorld | None:
    """The launcher's world, or None when no launcher started this process (the run starts its own)."""
    if "TORCHELASTIC_RUN_ID" in environ:
        return _torchrun(environ)
    if "SLURM_STEP_ID" in environ and "SLURM_PROCID" in environ:  # a task of an srun step, not the batch script
        return _slurm(environ)
    if "OMPI_COMM_WORLD_SIZE" in environ:
        return _mpi(
            environ,
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        )
    if "PMI_SIZE" in environ and "PMI_RANK" in environ:  # MPICH's Hydra (and Intel MPI)
        return _mpi(environ, "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    if {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"} <= set(environ):  # env:// (PyTorchJob, SageMaker)
        return _env(environ)
    return None


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = environ.get(name)
    if value is None:
        if default is None:
            raise LaunchWorldError(f"{name}: expected the launcher to set it, found it unset")
        return default
    try:
        return int(value)
    except ValueError:
        raise LaunchWorldError(f"{name}: expected a whole number, found {value!r}") from None


def _port(environ: Mapping[str, str], default: int | None = None) -> int:
    port = _int(environ, "MASTER_PORT", default)
    if not 0 < port < 65536:
        raise LaunchWorldError(f"MASTER_PORT: expected a port from 1 to 65535, found {port}")
    return port


def _checked(world: LaunchWorld) -> LaunchWorld:
    if not 0 <= world.rank < world.world_size or not 0 <= world.local_rank < world.local_world_size:
        raise LaunchWorldError(
            f"{world.source}: rank {world.rank} of {world.world_size}, local rank "
            f"{world.local_rank} of {world.local_world_size}: expected ranks inside the sizes"
        )
    if world.local_world_size * world.num_nodes != world.world_size:
        raise LaunchWorldError(
            f"{world.source}: {world.world_size} processes on {world.num_nodes} nodes with "
            f"{world.local_world_size} on this one: expected the same number of processes on "
            "each node"
        )
    return world


def _torchrun(environ: Mapping[str, str]) -> LaunchWorld:
    world_size, local = _int(environ, "WORLD_SIZE"), _int(environ, "LOCAL_WORLD_SIZE")
    source = f"torchrun (WORLD_SIZE={world_size}, LOCAL_WORLD_SIZE={local})"
    return _checked(
        LaunchWorld(
            "torchrun",
            world_size,
            _int(environ, "RANK"),
            _int(environ, "LOCAL_RANK"),
            local,
            node_rank=_int(environ, "GROUP_RANK", 0),
            num_nodes=max(1, world_size // max(local, 1)),
            master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_port(environ),
            restart=_int(environ, "TORCHELASTIC_RESTART_COUNT", 0),
            job_id=environ["TORCHELASTIC_RUN_ID"],
            agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
            source=source,
        )
    )


def _slurm(environ: Mapping[str, str]) -> LaunchWorld:
    world_size = _int(
        environ, "SLURM_STEP_NUM_TASKS", None if "SLURM_NTASKS" not in environ else _int(environ, "SLURM_NTASKS")
    )
    nodes = _int(environ, "SLURM_STEP_NUM_NODES", _int(environ, "SLURM_NNODES", 1))
    node = _int(environ, "SLURM_NODEID", 0)
    per_node = tasks_per_node(
        environ.get("SLURM_STEP_TASKS_PER_NODE")
        or environ.get("SLURM_TASKS_PER_NODE")
        or str(world_size // max(nodes, 1))
    )
    if len(set(per_node)) > 1:
        raise LaunchWorldError(
            f"SLURM_STEP_TASKS_PER_NODE={','.join(map(str, per_node))}: expected the same number "
            "of tasks on each node (srun --ntasks-per-node)"
        )
    local = per_node[min(node, len(per_node) - 1)]
    job = environ.get("SLURM_JOB_ID", "0")
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_NODELIST") or "127.0.0.1"
    address = environ.get("MASTER_ADDR") or first_host(nodelist)
    if nodes == 1 and "MASTER_ADDR" not in environ:
        address = "127.0.0.1"
    default_port = SLURM_BASE_PORT + int(re.sub(r"\D", "", job)[-4:] or 0)
    source = f"Slurm (SLURM_STEP_NUM_TASKS={world_size}, SLURM_STEP_NUM_NODES={nodes}, {local} task(s) on this node)"
    return _checked(
        LaunchWorld(
            "slurm",
            world_size,
            _int(environ, "SLURM_PROCID"),
            _int(environ, "SLURM_LOCALID", 0),
            local,
            node_rank=node,
            num_nodes=nodes,
            master_addr=address,
            master_port=_port(environ, default_port),
            restart=_int(environ, "SLURM_RESTART_COUNT", 0),
            job_id=job,
            source=source,
        )
    )


def _mpi(environ: Mapping[str, str], size: str, rank: str, local_rank: str, local_size: str) -> LaunchWorld:
    world_size = _int(environ, size)
    local = _int(environ, local_size, world_size if local_size not in environ and world_size == 1 else None)
    nodes = max(1, world_size // max(local, 1))
    if nodes > 1 and "MASTER_ADDR" not in environ:
        raise LaunchWorldError(
            f"MASTER_ADDR: mpirun started {world_size} processes on {nodes} nodes; expected "
            "MASTER_ADDR (and MASTER_PORT) naming the first rank's host, passed to every rank "
            "(Open MPI: mpirun -x MASTER_ADDR -x MASTER_PORT)"
        )
    source = f"mpirun ({size}={world_size}, {local_size}={local})"
    return _checked(
        LaunchWorld(
            "mpi",
            world_size,
            _int(environ, rank),
            _int(environ, local_rank, 0 if world_size == 1 else None),
            local,
            node_rank=_int(environ, rank) // max(local, 1),
            num_nodes=nodes,
            master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_port(environ, 29500),
            source=source,
        )
    )


def _env(environ: Mapping[str, str]) -> LaunchWorld:
    world_size = _int(environ, "WORLD_SIZE")
    local = _int(environ, "LOCAL_WORLD_SIZE", 1)
    source = f"env:// (WORLD_SIZE={world_size}, LOCAL_WORLD_SIZE={local})"
    return _checked(
        LaunchWorld(
            "env",
            world_size,
            _int(environ, "RANK"),
            _int(environ, "LOCAL_RANK", 0),
            local,
            node_rank=_int(environ, "NODE_RANK", _int(environ, "GROUP_RANK", _int(environ, "RANK") // max(local, 1))),
            num_nodes=max(1, world_size // max(local, 1)),
            master_addr=environ["MASTER_ADDR"],
            master_port=_port(environ),
            source=source,
        )
    )


def tasks_per_node(value: str) -> list[int]:
    """Slurm's compressed task counts, one per node: '2(x3),1' is [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise LaunchWorldError(f"SLURM_STEP_TASKS_PER_NODE: expected counts such as 2(x3),1, found {value!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list ('gpu[07-09,12],cpu1' is gpu07), as `scontrol show hostnames` expands it."""
    match = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?([^,]*)", nodelist.strip())
    if match is None or not (match.group(1) or match.group(2)):
        raise LaunchWorldError(f"SLURM_STEP_NODELIST: expected a host list, found {nodelist!r}")
    prefix, ranges, suffix = match.groups()
    if ranges is None:
        return prefix + suffix
    return prefix + ranges.split(",")[0].split("-")[0] + suffix
