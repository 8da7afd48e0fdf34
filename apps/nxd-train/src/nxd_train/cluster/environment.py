"""Lightning Fabric under the launcher that started the processes: Fabric's cluster environment from the
launcher's world (nxd-parallel's `launch_world`), and a DDP strategy whose process group meets on a store
made for this launch round (restart-safe, loopback-only when every process is on this host)."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist
from lightning_fabric.plugins.environments import ClusterEnvironment
from lightning_fabric.strategies import DDPStrategy
from nxd_parallel import LaunchWorld, client_store, init_world


class RanksDidNotMeet(RuntimeError):
    """The ranks did not all meet on the run's store at start-up (a rank slow to start, gone, or unreachable)."""


class LaunchedEnvironment(ClusterEnvironment):
    """The processes a launcher (torchrun, Slurm, mpirun, env://) started, as Fabric asks for them."""

    def __init__(self, world: LaunchWorld):
        super().__init__()
        self.world = world

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return self.world.master_addr

    @property
    def main_port(self) -> int:
        return self.world.master_port

    @staticmethod
    def detect() -> bool:
        return False

    def world_size(self) -> int:
        return self.world.world_size

    def set_world_size(self, size: int) -> None:
        pass  # the launcher's

    def global_rank(self) -> int:
        return self.world.rank

    def set_global_rank(self, rank: int) -> None:
        pass  # the launcher's

    def local_rank(self) -> int:
        return self.world.local_rank

    def node_rank(self) -> int:
        return self.world.node_rank


class RoundStrategy(DDPStrategy):
    """Fabric's DDP strategy with the default process group initialised on this round's store."""

    def __init__(self, world: LaunchWorld | None, **kwargs: object):
        super().__init__(**kwargs)
        self.world = world
        self.round = 1

    def _store_settings(self) -> dict:
        world = self.world
        return dict(
            agent_store=world is not None and world.agent_store,
            single_host=self.num_nodes == 1 if world is None else world.single_host,
        )

    def _setup_distributed(self) -> None:
        self._set_world_ranks()
        if not dist.is_initialized():
            env = self.cluster_environment
            device = self.root_device if self.root_device.type != "cpu" else None
            try:
                self.round = init_world(
                    self._get_process_group_backend(),
                    env.main_address,
                    env.main_port,
                    self.global_rank,
                    self.world_size,
                    self._timeout,
                    device_id=device,
                    **self._store_settings(),
                )
            except (dist.DistStoreError, dist.DistNetworkError) as error:  # the store or a peer did not answer
                raise RanksDidNotMeet(self._did_not_meet(error)) from error
        super()._setup_distributed()  # Fabric's bookkeeping; the group exists already

    def _did_not_meet(self, error: RuntimeError) -> str:
        env, seconds = self.cluster_environment, int(self._timeout.total_seconds())
        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        said = (
            f"rank {self.global_rank} of {self.world_size} did not meet the other ranks at start-up on the run's "
            f"store at {env.main_address}:{env.main_port} ({cause})"
        )
        if "timed out" not in cause and "timeout" not in cause:
            return said
        return (
            f"{said}; torch applies distributed_strategy.collective_timeout ({seconds} s) to start-up too, so a "
            "rank slower to start than that (imports from a shared filesystem, a busy host) needs a longer one"
        )

    def watch_store(self, timeout: timedelta) -> dist.Store:
        """A connection of its own to this round's store, for the peer watch."""
        env = self.cluster_environment
        return client_store(
            env.main_address,
            env.main_port,
            self.world_size,
            timeout,
            round=self.round,
            suffix="peers/",
            **self._store_settings(),
        )
