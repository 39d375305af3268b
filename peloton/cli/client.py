"""The client side of the daemon's gRPC API, as the commands use it, over the CLI's own transport (transport.py:
no grpcio, whose import alone would cost ~60 ms). Each service's generated messages are imported when a command
first uses that service; the methods are made from the service descriptors in those modules (the generated
`*_pb2_grpc` stubs would import grpc)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from peloton.cli.connection import Target
from peloton.cli.transport import Channel, RpcError, StatusCode, Tls
from peloton.errors import Unavailable

if TYPE_CHECKING:
    from types import ModuleType

    from google.protobuf.message import Message

    from peloton.api.v1 import job_pb2
    from peloton.cli.reconnect import Reconnect

# the component whose process serves each service (docs/running.md, "Components in separate processes")
SERVED_BY = {"JobService": "jobmgr", "TaskService": "jobmgr", "AuditService": "jobmgr",
             "ResourcePoolService": "resmgr", "HostService": "hostmgr", "ModelService": "jobmgr"}


class Stub:
    """The methods of one service of a generated module (`stub.GetJob(request, timeout=...)`, `.future(...)`),
    made from its descriptor when first used."""

    def __init__(self, channel: Channel, module: ModuleType, service: str) -> None:
        self._channel = channel
        self._service = module.DESCRIPTOR.services_by_name[service]

    def __getattr__(self, name: str) -> Any:
        from google.protobuf.message_factory import GetMessageClass

        try:
            m = self._service.methods_by_name[name]
        except KeyError:
            raise AttributeError(f"{self._service.full_name} has no method {name}") from None
        request, response = GetMessageClass(m.input_type), GetMessageClass(m.output_type)
        make = self._channel.unary_stream if m.server_streaming else self._channel.unary_unary
        method = make(f"/{self._service.full_name}/{name}", request_serializer=request.SerializeToString,
                      response_deserializer=response.FromString)
        setattr(self, name, method)
        return method


def _from_daemon(e: RpcError) -> bool:
    """The daemon itself answered (UNAVAILABLE with its retry hint: its store is down, say), as opposed to a
    daemon that could not be reached at all."""
    return any(k == "retry-after-ms" for k, _ in e.trailing_metadata())


class Client:
    def __init__(self, target: Target | str, timeout: float = 30.0) -> None:
        """`target`: where the daemon is and how to reach it (connection.resolve), or just its address."""
        if isinstance(target, str):
            target = Target(target)
        self.timeout = timeout
        self.command = ""  # the command this client runs for (`host list`), named in some errors
        self.target = target
        tls = Tls(target.tls_ca, target.client_cert, target.client_key) if target.tls else None
        auth = [("authorization", f"Bearer {target.token}")] if target.token else []
        addresses = [a.strip() for a in target.address.split(",") if a.strip()] or [target.address]
        # several: a leader and its standbys, the cluster; the channel dials the first that answers, and follows a
        # standby's answer to the leader when it is one of them (or a person at the terminal allows it)
        self.channel = Channel(addresses[0], tls=tls, metadata=auth, others=addresses[1:], confirm=self._may_follow)

    @property
    def address(self) -> str:
        """The daemon's address this client talks to now (a standby's answer moves it to the leader)."""
        return self.channel.address

    def _may_follow(self, standby: str, leader: str) -> bool:
        """Whether to follow a standby to a leader outside the configured addresses: asked only of a person at a
        terminal (stdin and stderr both one); a script, a pipe or a cron job is refused (RedirectRefused says how to
        allow it)."""
        if not (sys.stdin.isatty() and sys.stderr.isatty()):
            return False
        sent = " and ".join(what for what, has in (("your token", self.target.token),
                                                   ("your client certificate", self.target.client_cert)) if has)
        print(f"peloton: the daemon at {standby} is a standby and names {leader} as the leader, which is not one of "
              f"the addresses configured ({', '.join(self.channel.addresses)}). Send the call"
              f"{' and ' + sent if sent else ''} to {leader}? [y/N] ", end="", file=sys.stderr, flush=True)
        return sys.stdin.readline().strip().lower() in ("y", "yes")

    @functools.cached_property
    def jobs(self) -> Any:
        from peloton.api.v1 import job_pb2

        return Stub(self.channel, job_pb2, "JobService")

    @functools.cached_property
    def tasks(self) -> Any:
        from peloton.api.v1 import task_pb2

        return Stub(self.channel, task_pb2, "TaskService")

    @functools.cached_property
    def pools(self) -> Any:
        from peloton.api.v1 import respool_pb2

        return Stub(self.channel, respool_pb2, "ResourcePoolService")

    @functools.cached_property
    def hosts(self) -> Any:
        from peloton.api.v1 import host_pb2

        return Stub(self.channel, host_pb2, "HostService")

    @functools.cached_property
    def models(self) -> Any:
        from peloton.api.v1 import model_pb2

        return Stub(self.channel, model_pb2, "ModelService")

    def call(self, method: Callable[..., Any], request: Message) -> Any:
        try:
            return method(request, timeout=self.timeout)
        except RpcError as e:
            raise self.error(e) from None

    def error(self, e: RpcError) -> Exception:
        """A failed call as the error hierarchy (UNAVAILABLE says which address could not be reached)."""
        from peloton.api.codes import error_for

        code = e.code()
        err = error_for(code.name, e.details())
        if code == StatusCode.CANCELLED and e.details() != "Locally cancelled":
            # the daemon's server ended the call as it stopped (a restart, a standby handing its port over to the
            # leader it became): what retries UNAVAILABLE retries this too (job create: with the same request id)
            return Unavailable(f"the daemon at {self.address} ended the call as it stopped or took over; retry")
        if code == StatusCode.UNAVAILABLE and not _from_daemon(e):
            where = "is it running? see --address"
            if self.target.searched:  # no address given: it fell back to TCP, finding no socket
                where = (f"is it running? no daemon socket at {self.target.searched} that this user may open; a "
                         "daemon of another --data-dir: export PELOTON_DATA_DIR=DIR, or see --address")
            err.message = f"cannot reach the peloton daemon at {self.address} ({where}): {e.details()}"
        elif code == StatusCode.UNIMPLEMENTED:
            err.message = self._not_served(e.path)
        return err

    def _not_served(self, path: str) -> str:
        """Why this process did not serve the call: in a split deployment (`--role`) another process runs the
        component it belongs to; which roles this one runs, and who leads the other, come from ClusterService,
        which every process serves. Without that (an older release): say so plainly."""
        service = path.split("/")[1].rsplit(".", 1)[-1] if path.count("/") == 2 else ""
        role = SERVED_BY.get(service)
        what = f"`{self.command}`" if self.command else "this call"
        plain = f"the daemon at {self.address} does not implement {what} (an older release?)"
        if role is None:
            return plain
        from peloton.api.v1 import cluster_pb2

        try:
            info = Stub(self.channel, cluster_pb2, "ClusterService").GetClusterInfo(
                cluster_pb2.GetClusterInfoRequest(), timeout=self.timeout)
        except RpcError:
            return plain
        if role in info.roles:
            return plain
        leader = next((r for r in info.leadership.roles if r.role == role and r.address), None)
        where = f" ({leader.address}, pid {leader.pid} on {leader.host})" if leader is not None else ""
        return (f"the daemon at {self.address} runs {', '.join(info.roles) or 'no component'}; {what} is served by "
                f"the process running {role}{where}: give its address with --address")

    def watch_jobs(self, job_ids: list[str], tasks: bool, reconnect: Reconnect, deadline: float | None = None
                   ) -> Iterator[job_pb2.WatchJobsResponse]:
        """WatchJobs on these jobs, resumed across broken streams (see reconnect.watch_jobs)."""
        from peloton.cli.reconnect import watch_jobs

        def open_stream(request: job_pb2.WatchJobsRequest, timeout: float | None) -> Any:
            return self.jobs.WatchJobs(request, timeout=timeout)

        return watch_jobs(open_stream, job_ids, tasks, reconnect, deadline, error=self.error)
