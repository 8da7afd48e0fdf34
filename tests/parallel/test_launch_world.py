"""launch_world against the variables each launcher documents (values copied from what torchrun 2.15, Slurm
22.05's srun and batch step, Open MPI and MPICH set), and the round store's prefix and loopback binding."""

from __future__ import annotations

import socket
import subprocess
from datetime import timedelta

import pytest
from nxd_parallel import LaunchWorldError, client_store, launch_world
from nxd_parallel.launch_world import first_host, tasks_per_node
from nxd_parallel.rendezvous import rendezvous_store

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "8d217f33",
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "node0",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RESTART_COUNT": "2",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
}
SRUN = {
    "SLURM_JOB_ID": "4711",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_NNODES": "1",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_TASKS_PER_NODE": "2",
    "SLURM_STEP_NODELIST": "vm",
    "SLURM_TASKS_PER_NODE": "2",
}


def test_torchrun():
    world = launch_world(TORCHRUN)
    assert (world.launcher, world.world_size, world.rank, world.local_rank, world.local_world_size) == (
        "torchrun",
        4,
        3,
        1,
        2,
    )
    assert (world.node_rank, world.num_nodes, world.restart, world.job_id, world.agent_store) == (
        1,
        2,
        2,
        "8d217f33",
        True,
    )
    assert (world.master_addr, world.master_port, world.single_host) == ("node0", 29500, False)


def test_srun_with_ntasks_alone_is_a_world_of_its_tasks():
    """`srun -n2` (no --ntasks-per-node): Lightning's SLURMEnvironment raises here."""
    world = launch_world(SRUN)
    assert (world.launcher, world.world_size, world.rank, world.local_world_size, world.num_nodes) == (
        "slurm",
        2,
        1,
        2,
        1,
    )
    assert (world.master_addr, world.master_port, world.job_id, world.restart) == ("127.0.0.1", 15000 + 4711, "4711", 0)
    requeued = launch_world(SRUN | {"SLURM_RESTART_COUNT": "1", "MASTER_PORT": "29400"})
    assert (requeued.restart, requeued.master_port) == (1, 29400)


def test_srun_over_nodes():
    env = SRUN | {
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
        "SLURM_NODEID": "1",
        "SLURM_PROCID": "6",
        "SLURM_LOCALID": "2",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
    }
    world = launch_world(env)
    assert (world.world_size, world.local_world_size, world.node_rank, world.num_nodes, world.master_addr) == (
        8,
        4,
        1,
        2,
        "gpu07",
    )
    with pytest.raises(LaunchWorldError, match="same number of tasks on each node"):
        launch_world(env | {"SLURM_STEP_TASKS_PER_NODE": "5,3"})


def test_the_batch_script_itself_is_no_launch():
    """In an sbatch script before srun there is one process: the run starts its own."""
    batch = {k: v for k, v in SRUN.items() if not k.startswith("SLURM_STEP")}
    assert launch_world(batch | {"SLURM_PROCID": "0"}) is None


def test_mpi_and_env():
    ompi = {
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    world = launch_world(ompi)
    assert (world.launcher, world.world_size, world.rank, world.single_host, world.master_addr) == (
        "mpi",
        2,
        1,
        True,
        "127.0.0.1",
    )
    with pytest.raises(LaunchWorldError, match="MASTER_ADDR"):
        launch_world(ompi | {"OMPI_COMM_WORLD_SIZE": "4"})  # two nodes, no address
    hydra = launch_world({"PMI_SIZE": "2", "PMI_RANK": "0", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"})
    assert (hydra.world_size, hydra.rank, hydra.local_world_size) == (2, 0, 2)
    env = launch_world({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "23456"})
    assert (env.launcher, env.num_nodes, env.node_rank, env.master_port) == ("env", 2, 1, 23456)


def test_no_launcher_and_lightnings_own_children():
    assert launch_world({}) is None
    assert (
        launch_world(
            {"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234"}
        )
        is None
    )


def test_bad_variables_are_named():
    with pytest.raises(LaunchWorldError, match="RANK: expected a whole number, found 'x'"):
        launch_world(TORCHRUN | {"RANK": "x"})
    with pytest.raises(LaunchWorldError, match="rank 9 of 4"):
        launch_world(TORCHRUN | {"RANK": "9"})


def test_slurm_lists():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert first_host("gpu[07-09,12],cpu1") == "gpu07" and first_host("vm") == "vm"
    assert first_host("rack1-n[3,5]") == "rack1-n3"


def test_round_store_prefix_and_loopback_binding():
    """A single-host store listens on 127.0.0.1 alone; a later round's keys never meet an earlier round's."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    timeout = timedelta(seconds=10)
    first, round_1 = rendezvous_store("127.0.0.1", port, 0, 1, timeout, single_host=True)
    first.set("rank_1", "old address")
    listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True)
    assert listening.stdout.split()[3] == f"127.0.0.1:{port}", listening.stdout
    assert client_store("127.0.0.1", port, 1, timeout, round=round_1).get("rank_1") == b"old address"
    # the same store kept across rounds (torchrun's agent's): a rank's next start is the next round
    _, round_2 = rendezvous_store("127.0.0.1", port, 0, 1, timeout, agent_store=True)
    _, round_3 = rendezvous_store("127.0.0.1", port, 1, 1, timeout, agent_store=True)
    assert (round_2, round_3) == (1, 1)  # first starts of ranks 0 and 1 under the agent's counting
    _, round_4 = rendezvous_store("127.0.0.1", port, 0, 1, timeout, agent_store=True)
    assert round_4 == 2
    stale = client_store("127.0.0.1", port, 1, timeout, round=1)
    stale.set("rank_1", "round 1's address")
    assert not client_store("127.0.0.1", port, 1, timeout, round=2).check(["rank_1"])
