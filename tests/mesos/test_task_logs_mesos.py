"""`peloton task logs` on the Mesos backend: read from the task's sandbox on its agent over the agent's files API
(tests/mesos/fake_agent_files.py serves it as Mesos does), in 64 KiB reads, bytes as they are."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import PELOTON
from tests.mesos.fake_agent_files import FakeAgentFiles
from tests.mesos.fake_master import FakeAgent
from tests.mesos.test_mesos_backend_e2e import (
    CPU_AGENT,
    Factory,
    MesosDaemon,
    daemons,  # noqa: F401 - fixture
    fid_of,
    start_daemon,  # noqa: F401 - fixture
    wait_whole,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

JOB = """
name: logs
instances: 2
task:
  command: sleep 1000
  resources: {cpu: 1, mem: 64Mi}
"""


@pytest.fixture
def agent_files() -> Iterator[FakeAgentFiles]:
    f = FakeAgentFiles()
    yield f
    f.stop()


def test_task_logs_come_from_the_agent_sandbox(fake_master_factory: Factory, agent_files: FakeAgentFiles,
                                               start_daemon: Callable[..., MesosDaemon],  # noqa: F811
                                               tmp_path: Path) -> None:
    fake = fake_master_factory([FakeAgent(None, "127.0.0.1", dict(CPU_AGENT), {}, port=agent_files.port)])
    d = start_daemon(fake.url)
    fid = fid_of(fake)
    job = d.create(JOB, tmp_path)
    tasks = sorted(wait_whole(fake, d, job), key=lambda t: t["instance"])
    # 200 KB with what a JSON string has to carry: control characters, quotes, backslashes, bytes that are not UTF-8
    content = b"".join(b"step %05d \x01 \"q\" \\ \xff\xfe loss=0.%d\n" % (i, i % 10) for i in range(5000))
    base = f"/frameworks/{fid}/executors/{tasks[0]['task_id']}/runs/latest"
    agent_files.files[f"{base}/stdout"] = content
    agent_files.files[f"{base}/stderr"] = b"warning: something\n"

    def logs(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([*PELOTON, "--address", d.address, "task", "logs", job, "0", *args],
                              capture_output=True, timeout=60)

    r = logs()  # the whole log
    assert r.returncode == 0, r.stderr
    assert r.stdout == content
    reads = [q["query"] for q in agent_files.requests if q["query"].get("path") == f"{base}/stdout"]
    assert all(int(q.get("length", 0)) <= 65536 for q in reads) and len(reads) >= 4  # in 64 KiB pieces
    assert reads[0] == {"path": f"{base}/stdout"}  # the size first (a tail)
    assert logs("--tail", "20").stdout == b"".join(content.splitlines(keepends=True)[-20:])  # lines, not bytes
    assert logs("--stderr").stdout == b"warning: something\n"
    # the other member's sandbox has no logs on the agent (collected): one line saying so
    other = subprocess.run([*PELOTON, "--address", d.address, "task", "logs", job, "1"], capture_output=True,
                           text=True, timeout=60)
    assert other.returncode == 1 and "has no such file" in other.stderr and "Traceback" not in other.stderr, \
        other.stderr
