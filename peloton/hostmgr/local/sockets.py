"""Which ports of this machine some socket holds now, read from the kernel's socket tables.

The local backend's simulated hosts share this machine's network: a port it hands a task may already be bound by
another process (an outgoing connection's ephemeral port, another daemon, a task that outlived its job), and the
task's `bind` then fails. The backend reads these tables when a gang that asks for ports is launched and refuses
the gang if one of its ports is taken, so the gang is placed again on other ports instead of failing.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

# every socket of this network namespace, IPv4 and IPv6, TCP (any state, TIME_WAIT included) and UDP
PROC_NET_TABLES = ("/proc/net/tcp", "/proc/net/tcp6", "/proc/net/udp", "/proc/net/udp6")


def parse_ports(table: str) -> set[int]:
    """The local ports of a /proc/net/{tcp,udp}[6] table: each row's `local_address` is `HEXADDR:HEXPORT`."""
    ports: set[int] = set()
    for line in table.splitlines()[1:]:  # (the first line names the columns)
        fields = line.split()
        if len(fields) < 2 or ":" not in fields[1]:
            continue
        try:
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except ValueError:
            continue
    ports.discard(0)  # an unbound socket
    return ports


def ports_in_use(tables: Iterable[str] = PROC_NET_TABLES) -> frozenset[int]:
    """The local ports of every socket in `tables`; empty where they cannot be read (not Linux)."""
    ports: set[int] = set()
    for path in tables:
        try:
            ports |= parse_ports(Path(path).read_text())
        except OSError:
            continue
    return frozenset(ports)
