"""The environment a gang member starts with, so that distributed training frameworks find their peers.

Pure: computed from the gang's assignments (and a job's roles) only. Rank = position of the member when the gang is
sorted by instance. The caller writes `hostfile(hostfile_members(members, roles))` to a file and sets
PELOTON_HOSTFILE to its path.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from peloton.domain.placement import MemberAssignment
from peloton.domain.spec import Role

__all__ = ["training_env", "hostfile", "hostfile_members", "ranked", "role_env_name", "slots_by_address",
           "with_env_files"]

HOSTFILE_ROLE = "worker"  # the role the hostfile lists, when a job has one of that name


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


def role_env_name(role: str) -> str:
    """`PELOTON_ROLE_HOSTS_<NAME>`'s NAME for a role name ([a-z][a-z0-9-]*): upper case, `-` as `_`."""
    return role.upper().replace("-", "_")


def _by_role(members: Sequence[MemberAssignment], roles: Sequence[Role]) -> list[list[MemberAssignment]]:
    """The members of each role (instances are numbered in role order), each list in role-rank order."""
    ends = []
    end = 0
    for r in roles:
        end += r.instances
        ends.append(end)
    out: list[list[MemberAssignment]] = [[] for _ in roles]
    for m in ranked(members):
        for i, e in enumerate(ends):
            if m.instance < e:
                out[i].append(m)
                break
    return out


def hostfile_members(members: Sequence[MemberAssignment], roles: Sequence[Role]) -> list[MemberAssignment]:
    """Whom the MPI/Horovod hostfile lists: for a job with roles the members of the role named `worker`, else of
    the roles that ask for GPUs, else every member; every member of a single-task job. In rank order."""
    if not roles:
        return ranked(members)
    groups = _by_role(members, roles)
    for r, g in zip(roles, groups, strict=True):
        if r.name == HOSTFILE_ROLE:
            return g
    gpu = [m for r, g in zip(roles, groups, strict=True) if r.resources.gpu > 0 for m in g]
    return gpu or ranked(members)


def _role_env(members: Sequence[MemberAssignment], roles: Sequence[Role]) -> dict[int, dict[str, str]]:
    """instance -> the role variables of a job with roles: its role, rank in it and size, every role's endpoints
    (PELOTON_ROLE_HOSTS_<NAME>) and TF_CONFIG (TensorFlow's cluster spec and this member's task in it)."""
    groups = _by_role(members, roles)
    names = [r.name for r in roles]
    endpoints = [[_endpoint(m) for m in g] for g in groups]
    common = {"PELOTON_ROLES": ",".join(names)}
    for name, eps in zip(names, endpoints, strict=True):
        common[f"PELOTON_ROLE_HOSTS_{role_env_name(name)}"] = ",".join(eps)
    # compact: every member carries it, and TF_CONFIG of a large gang is about as long as PELOTON_PEERS
    cluster = json.dumps(dict(zip(names, endpoints, strict=True)), separators=(",", ":"))
    out: dict[int, dict[str, str]] = {}
    for name, g in zip(names, groups, strict=True):
        for rank, m in enumerate(g):
            task = json.dumps({"type": name, "index": rank}, separators=(",", ":"))
            out[m.instance] = {**common, "PELOTON_ROLE": name, "PELOTON_ROLE_RANK": str(rank),
                               "PELOTON_ROLE_SIZE": str(len(g)), "TF_CONFIG": f'{{"cluster":{cluster},"task":{task}}}'}
    return out


def training_env(job_id: str, attempt: int, members: Sequence[MemberAssignment],
                 roles: Sequence[Role] = ()) -> dict[int, dict[str, str]]:
    """instance -> environment variables for every member of the gang; with `roles` (a job's JobSpec.roles, whose
    gang is every member of every role) also the role variables."""
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
    if roles:
        for instance, extra in _role_env(order, roles).items():
            out[instance].update(extra)
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
