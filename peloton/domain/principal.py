"""Who a caller is as the rules see it: the permissions, the roles that grant them, and a principal (a name, its
roles, how it was established, the Unix users its jobs may name). Plain data and pure rules; how a principal is
established (tokens, certificates, the principals file) is peloton/security/identity.py's, and the principal of
the call being served is peloton/api/caller.py's."""

from __future__ import annotations

from dataclasses import dataclass, field

from peloton.errors import PermissionDenied

JOB_CREATE = "job.create"
JOB_READ = "job.read"
JOB_CONTROL_OWN = "job.control.own"  # stop and delete one's own jobs
JOB_CONTROL_ANY = "job.control.any"
JOB_SECRETS_ANY = "job.secrets.any"  # the environment values and logs of any job (one's own are always visible)
POOL_READ = "pool.read"
POOL_WRITE = "pool.write"
HOST_READ = "host.read"
HOST_OPERATE = "host.operate"  # host drain; failure injection of the sim backend
AUDIT_READ = "audit.read"
ALL = frozenset({JOB_CREATE, JOB_READ, JOB_CONTROL_OWN, JOB_CONTROL_ANY, JOB_SECRETS_ANY, POOL_READ, POOL_WRITE,
                 HOST_READ, HOST_OPERATE, AUDIT_READ})

ROLES: dict[str, frozenset[str]] = {
    "admin": ALL,
    "operator": frozenset({JOB_CREATE, JOB_READ, JOB_CONTROL_OWN, JOB_CONTROL_ANY, JOB_SECRETS_ANY, POOL_READ,
                           HOST_READ, HOST_OPERATE, AUDIT_READ}),
    "submitter": frozenset({JOB_CREATE, JOB_READ, JOB_CONTROL_OWN, POOL_READ, HOST_READ}),
    "viewer": frozenset({JOB_READ, POOL_READ, HOST_READ}),
}


@dataclass(frozen=True)
class Principal:
    name: str
    roles: frozenset[str]
    via: str  # how it was established: "token", "certificate", "unix socket", "open" (no authentication)
    users: frozenset[str] = frozenset()  # Unix users its jobs may name in task.user besides `user`
    user: str = ""  # the Unix user the principals file maps it to (its tasks' identity); "": none mapped
    permissions: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        perms: set[str] = set()
        for r in self.roles:
            perms |= ROLES.get(r, frozenset())
        object.__setattr__(self, "permissions", frozenset(perms))

    def can(self, permission: str) -> bool:
        return permission in self.permissions

    def require(self, permission: str, what: str = "") -> None:
        if not self.can(permission):
            raise PermissionDenied(f"{self.name} may not {what or permission}: that needs the permission "
                                   f"{permission} ({_roles_with(permission)}), and {self.name} has "
                                   f"{', '.join(sorted(self.roles)) or 'no role'}")

    def may_control(self, owner: str) -> bool:
        return self.can(JOB_CONTROL_ANY) or (self.can(JOB_CONTROL_OWN) and owner == self.name)

    def may_see_secrets(self, owner: str) -> bool:
        return self.can(JOB_SECRETS_ANY) or owner == self.name

    def may_run_as(self, user: str) -> bool:
        """Whether this principal's jobs may name the Unix user `user` in task.user (root is the pool's business
        too). Never by its name alone: only the user the principals file maps it to, or lists for it."""
        return "admin" in self.roles or (bool(self.user) and user == self.user) or user in self.users

    def named_users(self) -> list[str]:
        """The users it may name, for messages."""
        return sorted({self.user, *self.users} - {""})


def _roles_with(permission: str) -> str:
    return "role " + " or ".join(r for r, p in ROLES.items() if permission in p)


OPEN = Principal("anonymous", frozenset({"admin"}), "open")
