"""The launcher's world is the run's world: the processes and nodes a launcher started against the config's
trainer.devices and trainer.num_nodes (refused, naming both numbers, before any process writes), and a
job the launcher restarted (torchrun's next round, Slurm's requeue) continuing in its own log directory
from its newest complete checkpoint."""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from nxd_config import ConfigNotice, NxdConfig
from nxd_parallel import LaunchWorld, LaunchWorldError, launch_world

from nxd_train.cluster.job import LAUNCHER_NAMES, Job
from nxd_train.logging.log_dir import launched_log_dir, optional_path


def launcher_world(
    cfg: NxdConfig, environ: Mapping[str, str], *, here: bool = True
) -> tuple[LaunchWorld | None, list[str]]:
    """The launcher's world, and why the config disagrees with it (`here`: the run starts in this process, not
    in a job written for a cluster)."""
    try:
        world = launch_world(environ)
    except LaunchWorldError as error:
        return None, [f"the launcher's variables: {error}"]
    nodes = cfg.trainer.num_nodes
    if world is None and here and nodes > 1 and not {"MASTER_ADDR", "NODE_RANK"} <= set(environ):
        return None, [
            f"trainer.num_nodes: {nodes}, but no launcher started this process on {nodes} nodes; expected "
            "a launch on each node: `nxd-train launch` writes the sbatch script (or each host's torchrun "
            f"command), or run torchrun --nnodes {nodes} on each node"
        ]
    if world is None:
        return None, []
    t, problems = cfg.trainer, []
    started = LAUNCHER_NAMES[world.launcher]
    if t.devices != world.local_world_size:
        problems.append(
            f"trainer.devices: {t.devices} process(es) per node, but {started} started "
            f"{world.local_world_size} on this node ({world.source}); expected trainer.devices: "
            f"{world.local_world_size} (GPT-NeoX: num_gpus), or launch {t.devices} per node"
        )
    if t.num_nodes != world.num_nodes:
        problems.append(
            f"trainer.num_nodes: {t.num_nodes}, but {started} started processes on {world.num_nodes} "
            f"node(s) ({world.source}); expected trainer.num_nodes: {world.num_nodes} (GPT-NeoX: "
            f"num_nodes), or launch on {t.num_nodes} node(s)"
        )
    return world, problems


def readable_world(environ: Mapping[str, str]) -> LaunchWorld | None:
    """The launcher's world, or None when no launcher started this process or its variables are bad (the
    preflight names them)."""
    try:
        return launch_world(environ)
    except LaunchWorldError:
        return None


def restarted(cfg: NxdConfig, job: Job | None) -> NxdConfig:
    """`cfg` as a job the launcher restarted continues it: in the log directory its first round took, from
    the newest complete checkpoint there (a new start when none is complete yet)."""
    if job is None or job.restart == 0:
        return cfg
    exp = cfg.exp_manager
    folder = exp.explicit_log_dir or launched_log_dir(optional_path(exp.exp_dir), exp.name or cfg.name, job.tag)
    if folder is None:
        return cfg
    if not exp.resume_if_exists:
        warnings.warn(
            f"{job.says()}: continuing in {folder} from its newest complete checkpoint", ConfigNotice, stacklevel=2
        )
    update = {"resume_if_exists": True, "resume_ignore_no_checkpoint": True, "explicit_log_dir": str(folder)}
    return cfg.model_copy(update={"exp_manager": exp.model_copy(update=update)})
