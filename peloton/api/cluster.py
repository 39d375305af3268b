"""ClusterService: what this daemon is and how it is set up (`peloton cluster info`). Thin: the daemon hands it
the facts at start; only the caller and the host count are read per call."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from peloton import __version__
from peloton.api import caller
from peloton.api.convert import resources_to_proto
from peloton.api.status import grpc_errors
from peloton.api.v1 import cluster_pb2, cluster_pb2_grpc
from peloton.domain.resources import Resources
from peloton.errors import FailedPrecondition

if TYPE_CHECKING:
    import grpc


@dataclass(frozen=True)
class ClusterFacts:
    roles: Sequence[str]
    store: str
    backend: str
    started_at: float
    addresses: Sequence[str]
    tls: bool = False
    mutual_tls: bool = False
    tokens: bool = False
    insecure: bool = False
    warnings: Sequence[str] = field(default_factory=tuple)
    task_identities: str = ""  # per principal | mapped users | none (run_as.py)
    uid_range: str = ""
    owner: str = ""  # the daemon's own user: whom the owner-only socket's calls and a one-time console login are


@dataclass(frozen=True)
class Leader:
    """A lock's holder as callers are told of it (peloton/leadership/owner.py's Owner, what the API shows of it)."""
    address: str
    host: str
    pid: int
    since: float
    lease: float  # seconds a silent holder keeps the lock before a standby ends it


@dataclass(frozen=True)
class Leadership:
    """Who acts on the store, as the store says (read per call)."""
    leader: Leader | None
    epoch: int
    standbys: Sequence[tuple[str, float, tuple[str, ...]]]  # (address, waiting since, roles)
    roles: Sequence[tuple[str, Leader, float]] = ()  # (role, its leader, seconds since its last renewal)


@dataclass(frozen=True)
class ConsoleLogins:
    """The web console's one-time logins (security/console_login.py), handed over by the daemon where it serves a
    console: `make()` -> (login id, secret, seconds it lasts); `spend(id, secret)` raises PermissionDenied."""
    url: str  # the console's address
    authenticated: bool  # without authentication no login is asked: the address alone is answered
    make: Callable[[], tuple[str, str, int]]
    spend: Callable[[str, str], None]


@dataclass(frozen=True)
class Stage:
    """How long gangs spent in one stage (gang_metrics.py): how many, the mean and p50, p95, p99 in seconds."""
    stage: str
    count: int
    mean: float
    quantiles: tuple[float, ...]  # p50, p95, p99


@dataclass(frozen=True)
class ClusterSummary:
    """GetClusterSummary's answer, gathered by the daemon from the components this process runs (`sources`)."""
    sources: tuple[str, ...] = ()
    hosts: int = 0
    host_states: Mapping[str, int] = field(default_factory=dict)
    capacity: Resources = Resources()
    allocated: Resources = Resources()
    gpus: Mapping[str, int] = field(default_factory=dict)
    racks: int = 0
    queued_gangs: int = 0
    gang_states: Mapping[str, int] = field(default_factory=dict)
    stages: Sequence[Stage] = ()


class ClusterServicer(cluster_pb2_grpc.ClusterServiceServicer):
    def __init__(self, facts: ClusterFacts, hosts: Callable[[], int] = lambda: 0,
                 leadership: Callable[[], Leadership | None] = lambda: None,
                 console: ConsoleLogins | None = None,
                 summary: Callable[[], ClusterSummary] = ClusterSummary) -> None:
        self.facts = facts
        self.hosts = hosts
        self.leadership = leadership
        self.console = console
        self.summary = summary

    @grpc_errors
    def CreateConsoleLogin(self, request: cluster_pb2.CreateConsoleLoginRequest, context: grpc.ServicerContext) -> cluster_pb2.CreateConsoleLoginResponse:
        """Only the daemon's own user over the owner-only socket gets here (identity.METHODS)."""
        c = self._console()
        if not c.authenticated:
            return cluster_pb2.CreateConsoleLoginResponse(url=c.url, no_login_needed=True)
        login_id, secret, ttl = c.make()
        # in the fragment: a browser never sends it, so no log of any proxy or server sees the code
        return cluster_pb2.CreateConsoleLoginResponse(url=f"{c.url}login#once={login_id}.{secret}", ttl_seconds=ttl,
                                                      login_id=login_id)

    @grpc_errors
    def RedeemConsoleLogin(self, request: cluster_pb2.RedeemConsoleLoginRequest, context: grpc.ServicerContext) -> cluster_pb2.RedeemConsoleLoginResponse:
        """Only this daemon's console gets here (identity.METHODS): the login spent, and for whom it was."""
        c = self._console()
        if not c.authenticated:
            raise FailedPrecondition("authentication is off: the console asks no login")
        c.spend(request.login_id, request.secret)
        return cluster_pb2.RedeemConsoleLoginResponse(principal=self.facts.owner)

    def _console(self) -> ConsoleLogins:
        if self.console is None:
            raise FailedPrecondition("this daemon serves no web console (--ui-listen, and a process with the job "
                                     "manager)")
        return self.console

    @grpc_errors
    def GetClusterSummary(self, request: cluster_pb2.GetClusterSummaryRequest, context: grpc.ServicerContext) -> cluster_pb2.GetClusterSummaryResponse:
        s = self.summary()
        out = cluster_pb2.GetClusterSummaryResponse(
            sources=list(s.sources), hosts=s.hosts, capacity=resources_to_proto(s.capacity),
            allocated=resources_to_proto(s.allocated), racks=s.racks, queued_gangs=s.queued_gangs,
            stages=[cluster_pb2.StageLatency(stage=g.stage, count=g.count, mean_seconds=g.mean,
                                             p50_seconds=g.quantiles[0], p95_seconds=g.quantiles[1],
                                             p99_seconds=g.quantiles[2]) for g in s.stages])
        out.host_states.update(s.host_states)
        out.gpus.update(s.gpus)
        out.gang_states.update(s.gang_states)
        return out

    @grpc_errors
    def GetClusterInfo(self, request: cluster_pb2.GetClusterInfoRequest, context: grpc.ServicerContext) -> cluster_pb2.GetClusterInfoResponse:
        f = self.facts
        who = caller.current()
        return cluster_pb2.GetClusterInfoResponse(
            version=__version__, roles=list(f.roles), store=f.store, backend=f.backend, started_at=f.started_at,
            addresses=list(f.addresses), hosts=self.hosts(),
            security=cluster_pb2.Security(
                tls=f.tls, mutual_tls=f.mutual_tls, tokens=f.tokens, insecure=f.insecure, caller=who.name,
                caller_roles=sorted(who.roles), caller_via=who.via, warnings=list(f.warnings),
                task_identities=f.task_identities, uid_range=f.uid_range),
            leadership=_leadership_to_proto(self.leadership()),
        )


def _leadership_to_proto(lead: Leadership | None) -> cluster_pb2.Leadership | None:
    if lead is None:
        return None
    out = cluster_pb2.Leadership(epoch=lead.epoch, standbys=[
        cluster_pb2.Standby(address=a, waiting_since=t, roles=list(roles)) for a, t, roles in lead.standbys], roles=[
        cluster_pb2.RoleLeader(role=r, address=o.address, host=o.host, pid=o.pid, since=o.since, silent_seconds=q)
        for r, o, q in lead.roles])
    if lead.leader is not None:
        o = lead.leader
        out.leader, out.leader_host, out.leader_pid = o.address, o.host, o.pid
        out.leading_since, out.lease_seconds = o.since, o.lease
    return out
