"""The components as separate processes: the same gRPC contracts between them, only the addresses change; the
internal services are served on their own listener, to the components' shared secret only."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import grpc
import pytest

from peloton.api.v1 import internal_pb2, internal_pb2_grpc
from peloton.security.component_auth import METADATA_KEY
from tests.e2e.harness import Daemon, kill_sandboxed_processes

pytestmark = pytest.mark.e2e


class RoleDaemon(Daemon):
    """A daemon process running only some components (`extra` flags pick them and their peers)."""

    extra: list[str]

    def server_args(self) -> list[str]:
        return [*super().server_args(), *self.extra]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_hostmgr_in_its_own_process(db_url: str, tmp_path: Path) -> None:
    hostmgr = RoleDaemon(tmp_path / "hostmgr", db_url)
    hostmgr.extra = ["--role", "hostmgr"]
    rest = RoleDaemon(tmp_path / "rest", db_url)
    try:
        hostmgr.start()
        socket = tmp_path / "hostmgr" / "internal.sock"  # the default: unix:<data-dir>/internal.sock
        secret = tmp_path / "hostmgr" / "internal.secret"  # created by the process that serves
        assert stat.S_IMODE(socket.stat().st_mode) == 0o600 and stat.S_IMODE(secret.stat().st_mode) == 0o600
        rest.extra = ["--role", "jobmgr,resmgr,placement", "--hostmgr", f"unix:{socket}",
                      "--internal-secret-file", str(secret)]
        rest.start()
        job = rest.create(f"""
name: split
instances: 2
task: {{command: "{sys.executable} -c 'import os; print(os.environ[\\"RANK\\"])'", resources: {{cpu: 1, mem: 64Mi}}}}
""", tmp_path)
        r = rest.cli("job", "wait", job, "--timeout", "60", check=False, timeout=90)
        assert r.returncode == 0, (r.stderr, rest.log()[-3000:], hostmgr.log()[-3000:])
        assert rest.cli("task", "logs", job, "1").stdout.strip() == "1"
        # hosts are served by the hostmgr process
        assert "local-1" in hostmgr.cli("host", "list").stdout
        # a process without a role it needs refuses to start, naming the flag
        bad = rest.cli("server", "--role", "jobmgr", "--resmgr", "", check=False)
        assert bad.returncode == 2 and "--resmgr" in bad.stderr
        # the internal services: not on the public port; on their own socket only with the shared secret
        request = internal_pb2.ListRunningTasksRequest()
        with grpc.insecure_channel(hostmgr.address) as ch:
            with pytest.raises(grpc.RpcError) as e:
                internal_pb2_grpc.HostManagerInternalStub(ch).ListRunningTasks(request, timeout=10)
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with grpc.insecure_channel(f"unix:{socket}") as ch:
            stub = internal_pb2_grpc.HostManagerInternalStub(ch)
            for metadata in ((), ((METADATA_KEY, "not-the-secret-0123456789"),)):
                with pytest.raises(grpc.RpcError) as e:
                    stub.ListRunningTasks(request, timeout=10, metadata=metadata)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            stub.ListRunningTasks(request, timeout=10, metadata=((METADATA_KEY, secret.read_text().strip()),))
        # the peer's secret must be the one it serves with
        other = tmp_path / "other.secret"
        other.write_text("x" * 64)
        other.chmod(0o600)
        wrong = RoleDaemon(tmp_path / "wrong", db_url)
        r = wrong.cli("server", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "wrong"), "--db", db_url,
                      "--role", "placement", "--resmgr", f"unix:{tmp_path / 'nowhere.sock'}",
                      "--hostmgr", f"unix:{socket}", "--internal-secret-file", str(tmp_path / "missing.secret"),
                      check=False)
        assert r.returncode != 0 and "--internal-secret-file" in r.stderr and "does not exist" in r.stderr
    finally:
        rest.stop()
        hostmgr.stop()
        kill_sandboxed_processes(tmp_path)  # the tasks the hostmgr process started, if the test failed early


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_standby_job_manager_process_takes_over_with_the_hostmgr_apart(db_url: str, tmp_path: Path) -> None:
    """--role processes: the job manager (with resmgr and placement) has a standby on the same database; the host
    manager, which runs the tasks, is a process of its own. The leader is killed -9: the standby takes over within
    10 s and adopts the running gang from the host manager (same tasks, same attempt); new jobs run."""
    import time

    hostmgr = RoleDaemon(tmp_path / "hostmgr", db_url)
    hostmgr.extra = ["--role", "hostmgr"]
    socket, secret = tmp_path / "hostmgr" / "internal.sock", tmp_path / "hostmgr" / "internal.secret"
    peers = ["--role", "jobmgr,resmgr,placement", "--hostmgr", f"unix:{socket}", "--internal-secret-file",
             str(secret)]
    leader, standby = RoleDaemon(tmp_path / "a", db_url), RoleDaemon(tmp_path / "b", db_url)
    leader.extra, standby.extra = peers, peers
    spec = """
name: {name}
instances: 2
task: {{command: "sleep 600", resources: {{cpu: 1, mem: 64Mi}}}}
"""
    try:
        hostmgr.start()
        leader.start()
        standby.start(standby=True)
        job = leader.create(spec.format(name="before"), tmp_path)
        leader.wait_state(job, "RUNNING")
        before = sorted((t["task_id"], t["attempt"]) for t in leader.tasks(job))
        leader.kill9()
        killed_at = time.monotonic()
        standby.wait_serving()
        took_over = time.monotonic() - killed_at
        print(f"\n--role processes: the standby job manager served after {took_over:.2f} s")
        assert standby.wait_state(job, "RUNNING")["status"]["task_states"] == {"RUNNING": 2}
        assert sorted((t["task_id"], t["attempt"]) for t in standby.tasks(job)) == before  # adopted, not rerun
        after = standby.create(spec.format(name="after"), tmp_path)
        standby.wait_state(after, "RUNNING")
        for j in (job, after):
            standby.cli("job", "stop", j)
            standby.wait_state(j, "KILLED")
    finally:
        standby.stop()
        leader.stop()
        hostmgr.stop()
        kill_sandboxed_processes(tmp_path)
