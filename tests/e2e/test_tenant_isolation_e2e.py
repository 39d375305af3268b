"""Tenants that cannot touch each other (issue 19): the real daemon started as root on its secure defaults, tokens
made as docs/security.md says, two submitters. Each principal's tasks run as a Unix identity of its own, so one
tenant's job cannot read another's environment (/proc/<pid>/environ), sandbox or logs, nor signal its processes,
whatever task.user it asks for; a principal named like a system account does not run as that account.

docs/security.md's threat table names these tests line by line."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from peloton.security.identity import add_token
from tests.asroot import let_others_pass
from tests.dbutil import postgres_database
from tests.e2e.harness import PELOTON, Daemon, pid_alive, serving, wait_until

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(os.geteuid() != 0, reason="one Unix identity per tenant needs a root daemon")]

UID_LO, UID_HI = 65536, 99999  # the default --task-uid-range


@dataclass
class Cluster:
    d: Daemon
    tokens: dict[str, str]
    tmp: Path

    def cli(self, who: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The CLI as principal `who` (its token, over TCP), or as root over the owner-only socket (`root`)."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("PELOTON_")}
        if who == "root":
            env = {**base, "PELOTON_DATA_DIR": str(self.d.data_dir), "PELOTON_CONFIG": str(self.tmp / "none.toml")}
            argv = [*PELOTON, *args]
        else:
            env = {**base, "PELOTON_TOKEN": self.tokens[who], "PELOTON_CONFIG": str(self.tmp / "none.toml")}
            argv = [*PELOTON, "--address", self.d.address, *args]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
        if check and r.returncode != 0:
            raise AssertionError(f"{who}: peloton {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def create(self, who: str, spec: dict[str, object]) -> str:
        f = self.tmp / f"spec-{time.monotonic_ns()}.json"
        f.write_text(json.dumps(spec))
        return self.cli(who, "job", "create", "-f", str(f)).stdout.strip()

    def refused(self, who: str, spec: dict[str, object]) -> str:
        f = self.tmp / f"spec-{time.monotonic_ns()}.json"
        f.write_text(json.dumps(spec))
        r = self.cli(who, "job", "create", "-f", str(f), check=False)
        assert r.returncode != 0, f"{who} could create {spec}"
        return r.stderr

    def wait(self, job: str, *states: str, timeout: float = 60) -> dict[str, object]:
        def check() -> dict[str, object] | None:
            j = json.loads(self.cli("root", "job", "get", job, "-o", "json").stdout)
            return j if j["status"]["state"] in states else None
        return wait_until(check, timeout, 0.3, f"job {job} in {states}")

    def task(self, job: str) -> dict[str, object]:
        return json.loads(self.cli("root", "task", "list", job, "-o", "json").stdout)["tasks"][0]

    def logs(self, who: str, job: str) -> str:
        return self.cli(who, "task", "logs", job, "0").stdout


def job(command: str, env: dict[str, str] | None = None, user: str = "") -> dict[str, object]:
    task: dict[str, object] = {"command": command, "resources": {"cpu": 0.5, "mem": "64Mi"}, "env": env or {}}
    if user:
        task["user"] = user
    return {"name": "tenant", "instances": 1, "task": task}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One daemon per store for the module's tests (a start, tokens and a CLI call cost each test ~2 s): each test
    makes its own jobs and looks at nothing another leaves, and a principal's identity is its own for good, across
    tests as within one."""
    tmp_path = tmp_path_factory.mktemp("tenants")
    with contextlib.ExitStack() as stack:
        db_url = (f"sqlite:///{tmp_path}/peloton.db" if request.param == "sqlite"
                  else stack.enter_context(postgres_database()))
        yield stack.enter_context(_cluster(db_url, tmp_path))


@contextlib.contextmanager
def _cluster(db_url: str, tmp_path: Path) -> Iterator[Cluster]:
    d = Daemon(tmp_path / "data", db_url, secure_defaults=True, hosts=1, host_resources="cpu=8,mem=8Gi")
    let_others_pass(tmp_path)  # as /var/lib is: a task enters its sandbox by path as its own user
    with serving(d):
        # as `peloton token create NAME --role submitter` writes them (in this process: a CLI start each costs)
        tokens = {name: add_token(d.data_dir / "principals.json", name, ["submitter"])
                  for name in ("alice", "bob", "postgres", "daemon", "backup")}
        # carol: mapped by an admin to the daemon account, through the CLI
        r = subprocess.run([*PELOTON, "token", "create", "carol", "--role", "submitter", "--user", "daemon",
                            "--data-dir", str(d.data_dir)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        tokens["carol"] = r.stdout.strip()
        yield Cluster(d, tokens, tmp_path)


PROBE = r"""
try() { if "$@" >/dev/null 2>&1; then echo "GOT $1 $2 $3"; else echo "DENIED $1 $2 $3"; fi; }
try cat /proc/$TARGET_PID/environ
try cat /proc/$TARGET_PID/cwd/../stdout
try cat "$TARGET_SANDBOX/stdout"
try cat "$PELOTON_SANDBOX/../$TARGET_TASK/stdout"
try ls "$TARGET_SANDBOX"
try kill -0 $TARGET_PID
try kill -9 -- -$TARGET_PID
try kill -9 $TARGET_PID
echo "uid $(id -u) gid $(id -g) groups $(id -G)"
"""


def test_two_tenants_cannot_read_or_signal_each_others_tasks(cluster: Cluster) -> None:
    c = cluster
    secret = "s3cret-" + secrets.token_hex(8)
    a = c.create("alice", job("echo alice-was-here; exec sleep 300", {"SECRET": secret}))
    c.wait(a, "RUNNING")
    task = c.task(a)
    sandbox = c.d.data_dir / "local" / "sandboxes" / str(task["task_id"])
    pid = int(wait_until(lambda: (sandbox / "pids").exists() and (sandbox / "pids").read_text().strip(), 10))
    wait_until(lambda: b"alice-was-here" in (sandbox / "stdout").read_bytes(), 10, what="alice's output")

    # alice's sandbox and logs are alice's identity's, owner-only
    st = sandbox.stat()
    alice_uid = st.st_uid
    assert UID_LO <= alice_uid <= UID_HI and stat.S_IMODE(st.st_mode) == 0o700
    out = (sandbox / "stdout").stat()
    assert out.st_uid == alice_uid and stat.S_IMODE(out.st_mode) == 0o600
    assert f"runs as uid {alice_uid}" in c.cli("alice", "job", "get", a).stdout

    b = c.create("bob", job(PROBE, {"TARGET_PID": str(pid), "TARGET_SANDBOX": str(sandbox),
                                    "TARGET_TASK": str(task["task_id"])}))
    c.wait(b, "SUCCEEDED")
    report = c.logs("bob", b)
    assert "GOT" not in report, report
    assert report.count("DENIED") == 8, report
    bob_uid = int(report.split("uid ")[1].split()[0])
    assert UID_LO <= bob_uid <= UID_HI and bob_uid != alice_uid, report
    assert f"gid {bob_uid} groups {bob_uid}" in report  # its own group, no supplementary ones

    # alice's task lives on, untouched: still its first attempt
    assert pid_alive(pid)
    assert c.task(a)["attempt"] == 1 and c.wait(a, "RUNNING")
    # and through the API bob sees no more (the API held before this issue: checked again with identities on)
    r = c.cli("bob", "task", "logs", a, "0", check=False)
    assert r.returncode != 0 and "bob may not" in r.stderr, r.stderr

    # the identity is the principal's for good: alice's next job runs as the same uid
    again = c.create("alice", job("id -u"))
    c.wait(again, "SUCCEEDED")
    assert c.logs("alice", again).strip() == str(alice_uid)
    c.cli("alice", "job", "stop", a)


def test_whatever_task_user_a_tenant_asks_for_it_gets_only_its_own(cluster: Cluster) -> None:
    c = cluster
    first = c.create("alice", job("id -u"))
    c.wait(first, "SUCCEEDED")
    alice_uid = c.logs("alice", first).strip()
    for user in ("alice", "bob", "nobody", "daemon", "postgres", "root"):
        err = c.refused("bob", job("id", user=user))
        assert f"task.user: bob may not run tasks as '{user}'" in err, err
    err = c.refused("bob", job("id", user=f"#{alice_uid}"))  # an allocated uid is not a name one can ask for
    assert "task.user:" in err and "is not a user name" in err, err


def test_a_principal_named_like_a_system_account_does_not_run_as_it(cluster: Cluster) -> None:
    c = cluster
    seen = set()
    for name in ("postgres", "daemon", "backup"):
        j = c.create(name, job("id -u; id -un >/dev/null 2>&1 && echo has-name || echo no-name"))
        c.wait(j, "SUCCEEDED")
        out = c.logs(name, j)
        assert len(out.split()) == 2, out
        uid, user = out.split()
        assert UID_LO <= int(uid) <= UID_HI and user == "no-name", (name, uid, user)
        assert int(uid) != pwd.getpwnam(name).pw_uid
        seen.add(uid)
        err = c.refused(name, job("id", user=name))
        assert f"task.user: {name} may not run tasks as '{name}'" in err, err
    assert len(seen) == 3  # three principals, three identities
    # an account runs a principal's tasks only when an admin maps it explicitly (carol -> daemon)
    j = c.create("carol", job("id -un"))
    c.wait(j, "SUCCEEDED")
    assert c.logs("carol", j).strip() == "daemon"
    assert "runs as daemon" in c.cli("carol", "job", "get", j).stdout


def test_the_daemons_own_user_runs_as_the_default_user_and_cluster_info_says_how(cluster: Cluster) -> None:
    c = cluster
    j = c.create("root", job("id -un"))
    c.wait(j, "SUCCEEDED")
    assert c.logs("root", j).strip() == "nobody"  # --default-task-user: never root by default
    info = c.cli("alice", "cluster", "info").stdout
    assert f"one per principal: its mapped user, else a uid of its own ({UID_LO}-{UID_HI})" in info, info
