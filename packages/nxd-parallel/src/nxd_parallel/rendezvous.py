"""The default process group of a run, on a rendezvous store made for the launch it belongs to.

Two things torch's `env://` rendezvous does not do for us:
- A restarted launch is a new round: torchrun's agent keeps one store for the whole job and
  `init_process_group` no longer prefixes keys by restart, so the new workers read the dead ones'
  gloo addresses and hang in connectFullMesh. Every key of a round here lives under its own prefix
  (`round_prefix`), for the process group and for anything else built on the store. The round is
  counted in the store itself (each rank counts its own starts), not taken from the agent's restart
  count: an agent restarted by hand starts counting at 0 while the others' count on, but every rank
  of a round has started the same number of times.
- A run whose processes are all on this host needs no socket any other host can reach: the store
  rank 0 hosts listens on the loopback only (TCPStore binds every interface unless given a listening
  socket), and gloo and NCCL are pointed at the loopback interface unless the user chose one.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch.distributed as dist

LOOPBACK_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def round_prefix(restart: int) -> str:
    """Where round `restart`'s keys live in a store kept across restarts."""
    return f"nxd/round{restart}/"


def loopback_interface() -> str | None:
    """The name of this host's loopback interface ('lo' on Linux, 'lo0' on BSDs and macOS), or None."""
    names = [name for _, name in socket.if_nameindex()]
    return next((name for name in ("lo", "lo0") if name in names), None)


def rendezvous_store(
    master_addr: str,
    master_port: int,
    rank: int,
    world_size: int,
    timeout: timedelta,
    *,
    agent_store: bool = False,
    single_host: bool = False,
) -> tuple[dist.Store, int]:
    """The store every rank of this round meets on, and the round: a client of torchrun's agent store when the
    agent serves one (kept across rounds), else a store rank 0 hosts for this launch alone (on the loopback only
    when `single_host`). Keys are prefixed by round."""
    if single_host and not agent_store:  # the store rank 0 hosts listens on the loopback only
        master_addr = "127.0.0.1"
    if agent_store or rank != 0:
        store = dist.TCPStore(master_addr, master_port, world_size, is_master=False, timeout=timeout)
    elif single_host:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", master_port))
        listener.listen(128)
        store = dist.TCPStore(
            "127.0.0.1",
            master_port,
            world_size,
            is_master=True,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=listener.detach(),
        )
    else:
        store = dist.TCPStore(
            master_addr, master_port, world_size, is_master=True, timeout=timeout, wait_for_workers=False
        )
    started = store.add(f"nxd/starts/{rank}", 1) if agent_store else 1  # this rank's starts in the job
    return dist.PrefixStore(round_prefix(started), store), started


def client_store(
    master_addr: str,
    master_port: int,
    world_size: int,
    timeout: timedelta,
    *,
    round: int = 1,
    agent_store: bool = False,
    single_host: bool = False,
    suffix: str = "",
) -> dist.Store:
    """A connection of its own to the run's store (for a watch thread that must not share training's),
    under `round`'s prefix (what `init_world` returned) and `suffix`."""
    if single_host and not agent_store:
        master_addr = "127.0.0.1"
    store = dist.TCPStore(
        master_addr, master_port, world_size, is_master=False, timeout=timeout, wait_for_workers=False
    )
    return dist.PrefixStore(round_prefix(round) + suffix, store)


def init_world(
    backend: str,
    master_addr: str,
    master_port: int,
    rank: int,
    world_size: int,
    timeout: timedelta,
    *,
    agent_store: bool = False,
    single_host: bool = False,
    device_id: object = None,
) -> int:
    """Initialise the default process group on this round's store (see the module's docstring); the round."""
    if single_host and (interface := loopback_interface()) is not None:
        for name in LOOPBACK_VARIABLES:
            os.environ.setdefault(name, interface)
    store, started = rendezvous_store(
        master_addr, master_port, rank, world_size, timeout, agent_store=agent_store, single_host=single_host
    )
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=timeout, device_id=device_id
    )
    return started
