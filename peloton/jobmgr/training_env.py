"""The environment a gang member starts with, so that distributed training frameworks find their peers.

Pure: computed from the gang's assignments only. Rank = position of the member when the gang is sorted by
instance. The caller writes `hostfile(members)` to a file and sets PELOTON_HOSTFILE to its path.
"""

from __future__ import annotations

from collections.abc import Sequence

from peloton.domain.placement import MemberAssignment

__all__ = ["training_env", "hostfile", "ranked", "slots_by_address", "with_env_files"]


def ranked(members: Sequence[MemberAssignment]) -> list[MemberAssignment]:
    """Members in rank order (rank 0 = lowest instance)."""
    return sorted(members, key=lambda m: m.instance)


def slots_by_address(members: Sequence[MemberAssignment]) -> list[tuple[str, int]]:
    """(address, members on it) in rank order of first appearance."""
    slots: dict[str, int] = {}
    for m in ranked(members):
        slots[m.address] = slots.get(m.address, 0) + 1
    return list(slots.items())


def hostfile(members: Sequence[MemberAssignment]) -> str:
    """An MPI/Horovod hostfile: one `<address> slots=N` line per address, in rank order of first appearance."""
    return "".join(f"{addr} slots={n}\n" for addr, n in slots_by_address(members))


def _endpoint(m: MemberAssignment) -> str:
    return f"{m.address}:{m.ports[0]}" if m.ports else m.address


def training_env(job_id: str, attempt: int, members: Sequence[MemberAssignment]) -> dict[int, dict[str, str]]:
    """instance -> environment variables for every member of the gang."""
    order = ranked(members)
    world = len(order)
    slots = slots_by_address(order)
    hosts = ",".join(f"{addr}:{n}" for addr, n in slots)
    peers = ",".join(_endpoint(m) for m in order)
    master = order[0] if order else None
    # LOCAL_RANK counts members on the same host (hostname, not address: simulated local hosts share 127.0.0.1)
    per_host: dict[str, int] = {}
    for m in order:
        per_host[m.hostname] = per_host.get(m.hostname, 0) + 1
    seen: dict[str, int] = {}
    out: dict[int, dict[str, str]] = {}
    for rank, m in enumerate(order):
        local_rank = seen.get(m.hostname, 0)
        seen[m.hostname] = local_rank + 1
        env = {
            "PELOTON_JOB_ID": job_id,
            "PELOTON_TASK_ID": m.task_id,
            "PELOTON_INSTANCE": str(m.instance),
            "PELOTON_ATTEMPT": str(attempt),
            "PELOTON_RANK": str(rank),
            "PELOTON_WORLD_SIZE": str(world),
            "PELOTON_HOSTS": hosts,
            "PELOTON_PEERS": peers,
            "PELOTON_PORTS": ",".join(str(p) for p in m.ports),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(per_host[m.hostname]),
        }
        if master is not None:
            env["MASTER_ADDR"] = master.address
            if master.ports:
                env["MASTER_PORT"] = str(master.ports[0])
        out[m.instance] = env
    return out


def with_env_files(command: str, env_files: dict[str, str]) -> str:
    """`command` preceded by what sets each NAME of `env_files` to its file's content, read by the member itself
    at start (so the secret never passes through the daemon, its store or the API). A file it cannot read ends the
    member at once (exit 126) naming the variable and the file, on stderr. POSIX sh; the paths are quoted."""
    if not env_files:
        return command
    lines = []
    for name, path in sorted(env_files.items()):
        q = "'" + path.replace("'", "'\\''") + "'"
        lines.append(f'{name}="$(cat -- {q})" || {{ echo "peloton: cannot read {name} from {q}" >&2; exit 126; }}; '
                     f"export {name}")
    return "\n".join(lines) + "\n" + command
