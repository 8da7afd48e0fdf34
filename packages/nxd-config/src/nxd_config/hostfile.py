"""DeepSpeed's hostfile ('HOST slots=N' a line) and its include / exclude selections ('host1@host2:0,1'), as
GPT-NeoX's launcher and `nxd-train launch` read them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


class HostfileError(ValueError):
    """A hostfile or a selection of its hosts that cannot be read: `key` is the setting at fault (hostfile,
    include, exclude, nodes or per_node), `message` what was expected and found (naming the file and line)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


@dataclass(frozen=True)
class Host:
    name: str
    slots: tuple[int, ...]
    """The slot (device) numbers of this host that the job uses."""


HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*|[0-9A-Fa-f]*:[0-9A-Fa-f:.]*(%[A-Za-z0-9_.-]+)?")
"""A host name (letters, digits, '.', '-', '_', not starting with '-' or '.'), an IPv4 address, or hex digits, ':' and
'.' with a ':' (an IPv6 address): what ssh and torchrun take as a host, never as an option."""


def check_host_name(value: str | None) -> str | None:
    """`value` if it is a host name or address; a ValueError saying what was expected otherwise."""
    if value is not None and HOST_NAME.fullmatch(value) is None:
        raise ValueError(
            f"expected a host name or address (letters, digits, '.', '-', '_', starting with a letter, "
            f"digit or '_'), found {value!r}"
        )
    return value


def read_hostfile(path: Path) -> list[Host]:
    """DeepSpeed's hostfile: 'HOST slots=N' a line, '#' comments; a HostfileError naming the line otherwise."""
    try:
        text = path.read_text()
    except OSError as error:
        raise HostfileError("hostfile", f"cannot read {path} ({error.strerror or error})") from None
    hosts: dict[str, Host] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\d+)", line)
        if match is None or int(match.group(2)) < 1:
            raise HostfileError("hostfile", f"{path}:{number}: expected 'HOST slots=N' with N >= 1, found {line!r}")
        try:
            check_host_name(match.group(1))
        except ValueError as error:
            raise HostfileError("hostfile", f"{path}:{number}: {error}") from None
        if match.group(1) in hosts:
            raise HostfileError("hostfile", f"{path}:{number}: host {match.group(1)!r} is listed twice")
        hosts[match.group(1)] = Host(match.group(1), tuple(range(int(match.group(2)))))
    if not hosts:
        raise HostfileError("hostfile", f"{path} lists no host")
    return list(hosts.values())


def _selection(value: str, key: str, hosts: dict[str, Host]) -> dict[str, set[int] | None]:
    """DeepSpeed's include/exclude form 'host1@host2:0,1' as host -> slots (None: all of them)."""
    chosen: dict[str, set[int] | None] = {}
    for part in value.split("@"):
        name, _, slots = part.strip().partition(":")
        if name not in hosts:
            raise HostfileError(key, f"{name!r} is not a host of the hostfile ({', '.join(hosts)})")
        try:
            numbers = {int(slot) for slot in slots.split(",")} if slots else None
        except ValueError:
            raise HostfileError(key, f"expected slot numbers after ':', found {slots!r}") from None
        if numbers is not None and not numbers <= set(hosts[name].slots):
            raise HostfileError(key, f"host {name} has slots {list(hosts[name].slots)}, found {sorted(numbers)}")
        chosen[name] = numbers
    return chosen


def select_hosts(
    hosts: list[Host], include: str | None, exclude: str | None, nodes: int | None, per_node: int | None
) -> list[Host]:
    """The hosts and slots the job uses, as DeepSpeed's launcher picks them: include, or all but exclude, then
    the first `nodes` hosts and the first `per_node` slots of each."""
    if include and exclude:
        raise HostfileError("include", "expected include or exclude, found both")
    by_name = {host.name: host for host in hosts}
    if include:
        picked = _selection(include, "include", by_name)
        hosts = [
            Host(h.name, tuple(s for s in h.slots if picked[h.name] is None or s in picked[h.name]))
            for h in hosts
            if h.name in picked
        ]
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
            raise HostfileError("nodes", f"{nodes} nodes, but the hostfile leaves {len(hosts)} host(s)")
        hosts = hosts[:nodes]
    if per_node is not None:
        short = [h.name for h in hosts if len(h.slots) < per_node]
        if short:
            raise HostfileError("per_node", f"{per_node} per node, but {', '.join(short)} has fewer slots")
        hosts = [Host(h.name, h.slots[:per_node]) for h in hosts]
    if len({len(h.slots) for h in hosts}) > 1:
        raise HostfileError(
            "hostfile",
            "expected the same number of slots on each host, found "
            + ", ".join(f"{h.name} {len(h.slots)}" for h in hosts),
        )
    return hosts
