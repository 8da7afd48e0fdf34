"""What `nxd-train launch` writes, the hostfile selections it reads (DeepSpeed's rules, worked by hand), and the
launcher's world against the config's, without a cluster."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from nxd_config import HostfileError, load_config, read_hostfile, select_hosts
from nxd_train.checks.launcher import launcher_world
from nxd_train.cli import main
from nxd_train.cluster.scripts import host_commands, sbatch_script

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
HOSTS = "# four nodes\nnode0 slots=4\nnode1 slots=4\nnode2 slots=4  # spare\nnode3 slots=4\n"


def test_hostfile_selections_pick_as_deepspeed_does(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text(HOSTS)
    hosts = read_hostfile(path)
    assert [(h.name, h.slots) for h in hosts] == [(f"node{i}", (0, 1, 2, 3)) for i in range(4)]
    picked = select_hosts(hosts, "node1:0,1@node3:2,3", None, None, None)
    assert [(h.name, h.slots) for h in picked] == [("node1", (0, 1)), ("node3", (2, 3))]
    left = select_hosts(hosts, None, "node0@node2", 1, 2)  # then the first node, its first two slots
    assert [(h.name, h.slots) for h in left] == [("node1", (0, 1))]
    with pytest.raises(HostfileError, match="same number of slots on each host"):
        select_hosts(hosts, None, "node0:3", None, None)
    with pytest.raises(HostfileError, match="'node9' is not a host of the hostfile"):
        select_hosts(hosts, "node9", None, None, None)
    with pytest.raises(HostfileError, match="the hostfile leaves 4 host"):
        select_hosts(hosts, None, None, 5, None)
    path.write_text("node0 slots=four\n")
    with pytest.raises(HostfileError, match=r"hostfile:1: expected 'HOST slots=N'"):
        read_hostfile(path)


def test_the_sbatch_script_holds_the_jobs_shape_and_the_same_command():
    overrides = [
        "trainer.devices=4",
        "trainer.num_nodes=2",
        "data.global_batch_size=32",
        "+trainer.cluster.time=02:00:00",
        "+trainer.cluster.partition=gpu",
        "+trainer.cluster.gpus_per_node=4",
        "+trainer.cluster.account=ml",
        "+trainer.requeue_signal=SIGUSR2",
        "+trainer.cluster.signal_seconds=300",
    ]
    script = sbatch_script(load_config(TINY, overrides), [TINY], overrides)
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --time=02:00:00",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=ml",
        "#SBATCH --requeue",
        "#SBATCH --signal=USR2@300",
        "#SBATCH --job-name=tiny_llama",
    ):
        assert line + "\n" in script, line
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert shlex.split(srun)[2:] == [sys.executable, "-m", "nxd_train", str(TINY), *overrides]


def test_each_hosts_torchrun(tmp_path):
    (tmp_path / "hostfile").write_text(HOSTS)
    overrides = [
        "trainer.devices=2",
        "trainer.num_nodes=2",
        "data.global_batch_size=16",
        f"+trainer.cluster.hostfile={tmp_path / 'hostfile'}",
        "+trainer.cluster.exclude=node0",
        "+trainer.cluster.scheduler=hosts",
    ]
    script = host_commands(load_config(TINY, overrides), [TINY], overrides)
    remote = [shlex.split(shlex.split(line)[-2]) for line in script.splitlines() if line.startswith("ssh ")]
    assert [r[r.index("--node-rank") + 1] for r in remote] == ["0", "1"]
    assert all(
        r[r.index("--master-addr") + 1] == "node1"
        and r[r.index("--nproc-per-node") + 1] == "2"
        and "CUDA_VISIBLE_DEVICES=0,1" in r
        for r in remote
    )
    assert "# node rank 1: node2, slots 0,1" in script


def test_launch_never_replaces_a_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sbatch").write_text("mine\n")
    assert main(["launch", str(TINY), "trainer.max_steps=2", "--output", "job.sbatch"]) == 1
    assert "job.sbatch exists" in capsys.readouterr().err and (tmp_path / "job.sbatch").read_text() == "mine\n"


def test_the_launchers_world_must_be_the_configs():
    cfg = load_config(TINY)
    torchrun = {
        "TORCHELASTIC_RUN_ID": "x",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "1",
    }
    world, problems = launcher_world(cfg, torchrun)
    assert world.world_size == 4 and len(problems) == 2
    assert problems[0].startswith("trainer.devices: 1 process(es) per node, but torchrun started 2 on this node")
    assert problems[1].startswith("trainer.num_nodes: 1, but torchrun started processes on 2 node(s)")
    matching = load_config(TINY, ["trainer.devices=2", "trainer.num_nodes=2", "data.global_batch_size=16"])
    assert launcher_world(matching, torchrun)[1] == []
    two_nodes = load_config(TINY, ["trainer.num_nodes=2", "data.global_batch_size=8"])
    _, problems = launcher_world(two_nodes, {})
    assert "no launcher started this process on 2 nodes" in problems[0]
    assert launcher_world(two_nodes, {}, here=False)[1] == []


def test_a_restarted_job_continues_in_the_folder_its_first_round_took(tmp_path):
    """torchrun's rounds share a run id, Slurm's requeues a job id (also a batch script running nxd-train with no
    srun); the round that starts again finds its versioned log directory by the job recorded there."""
    from nxd_train.checks.launcher import restarted
    from nxd_train.cluster.job import job_of
    from nxd_train.logging.log_dir import record_launch

    batch = job_of(None, {"SLURM_JOB_ID": "4711", "SLURM_RESTART_COUNT": "1"})
    assert (batch.launcher, batch.job_id, batch.restart, batch.tag) == ("slurm", "4711", 1, "slurm 4711")
    assert job_of(None, {}) is None
    cfg = load_config(TINY, [f"exp_manager.exp_dir={tmp_path}"])
    for version, job in ((0, "slurm 4711"), (1, "slurm 99"), (2, None)):
        (tmp_path / "tiny_llama" / f"version_{version}").mkdir(parents=True)
        if job:
            record_launch(tmp_path / "tiny_llama" / f"version_{version}", job)
    continued = restarted(cfg, batch).exp_manager
    assert continued.explicit_log_dir == str((tmp_path / "tiny_llama" / "version_0").resolve())
    assert continued.resume_if_exists and continued.resume_ignore_no_checkpoint
    assert restarted(cfg, job_of(None, {"SLURM_JOB_ID": "4711"})) is cfg  # the first round: nothing to continue
