"""Retention through the real daemon (SQLite and PostgreSQL, local backend): finished jobs are deleted, with their
history and their sandboxes, once --job-retention has passed since they ended; unfinished ones stay."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.harness import Daemon, serving, wait_until

pytestmark = pytest.mark.e2e


@dataclass
class ShortRetention(Daemon):
    def server_args(self) -> list[str]:
        return [*super().server_args(), "--job-retention", "3s", "--audit-retention", "0"]


@pytest.fixture
def short(db_url: str, tmp_path: Path) -> Iterator[ShortRetention]:
    with serving(ShortRetention(tmp_path / "data", db_url)) as d:
        yield d


def test_finished_jobs_and_their_sandboxes_go_after_the_retention(short: ShortRetention, tmp_path: Path) -> None:
    d = short
    sandboxes = d.data_dir / "local" / "sandboxes"
    done = d.create("name: done\ninstances: 2\ntask: {command: 'echo hi', resources: {cpu: 0.5, mem: 32Mi}}\n",
                    tmp_path)
    running = d.create("name: sleeper\ninstances: 1\ntask: {command: 'sleep 300', resources: {cpu: 0.5, mem: 32Mi}}\n",
                       tmp_path)
    d.wait_state(done, "SUCCEEDED")
    d.wait_state(running, "RUNNING")
    assert len(list(sandboxes.glob(f"{done}-*"))) == 2
    wait_until(lambda: d.cli("job", "get", done, check=False).returncode == 1, 30, what="the finished job deleted")
    wait_until(lambda: list(sandboxes.glob(f"{done}-*")) == [], 15, what="its sandboxes removed (in the background)")
    assert d.state(running) == "RUNNING" and list(sandboxes.glob(f"{running}-*"))
    assert "retention: deleted 1 jobs" in d.log()
    d.cli("job", "stop", running)
