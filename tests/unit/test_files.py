"""Owner-only files: what the daemon creates, and what it tightens at start (its data dir, the SQLite store)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from peloton.errors import InvalidArgument
from peloton.files import private_dir, private_file, tighten
from peloton.hostmgr.local.task_env import DEFAULT_ALLOW, inherited, parse_allow
from peloton.server import Daemon
from peloton.settings import ServerConfig


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_tighten_keeps_the_owners_bits(tmp_path: Path) -> None:
    f = tmp_path / "run.sh"
    f.write_text("x")
    f.chmod(0o775)
    assert tighten(f) and mode(f) == 0o700
    assert not tighten(f)  # nothing left to remove
    assert not tighten(tmp_path / "missing")


def test_private_dir_creates_and_tightens_its_entries(tmp_path: Path) -> None:
    d = tmp_path / "a" / "data"
    private_dir(d)
    assert mode(d) == 0o700
    (d / "log").write_text("x")
    (d / "log").chmod(0o644)
    (d / "sub").mkdir(mode=0o755)
    d.chmod(0o755)
    private_dir(d)
    assert (mode(d), mode(d / "log"), mode(d / "sub")) == (0o700, 0o600, 0o700)


def test_private_file_is_created_owner_only_or_tightened(tmp_path: Path) -> None:
    f = tmp_path / "peloton.db"
    private_file(f)
    assert f.exists() and f.stat().st_size == 0 and mode(f) == 0o600
    f.write_text("data")
    f.chmod(0o644)
    private_file(f)
    assert mode(f) == 0o600 and f.read_text() == "data"  # kept


def test_a_daemon_tightens_a_loose_data_dir_and_store(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    old_log = data / "old.log"
    old_log.write_text("x")
    old_log.chmod(0o644)
    d = Daemon(ServerConfig(listen="127.0.0.1:0", db_url=None, data_dir=data, metrics_listen="", backend="sim"))
    d.start()
    try:
        # a root daemon keeps it traversable for the users its tasks run as (never listable or readable)
        assert mode(data) == (0o711 if os.geteuid() == 0 else 0o700) and mode(old_log) == 0o600
        for name in ("peloton.db", "peloton.db-wal", "peloton.db-shm"):
            if (data / name).exists():
                assert mode(data / name) == 0o600, name
        assert (data / "peloton.db").exists()
    finally:
        d.stop()


def test_task_env_allow_list() -> None:
    env = {"PATH": "/bin", "HOME": "/root", "LC_ALL": "C", "AWS_SECRET_ACCESS_KEY": "k", "NCCL_DEBUG": "INFO",
           "PGPASSWORD": "p"}
    assert inherited(env) == {"PATH": "/bin", "HOME": "/root", "LC_ALL": "C"}
    assert inherited(env, ("NCCL_*", "PGPASSWORD")) == {"PATH": "/bin", "HOME": "/root", "LC_ALL": "C",
                                                         "NCCL_DEBUG": "INFO", "PGPASSWORD": "p"}
    assert "PATH" in DEFAULT_ALLOW
    assert parse_allow("LD_LIBRARY_PATH, NCCL_*,,") == ("LD_LIBRARY_PATH", "NCCL_*")


@pytest.mark.parametrize("bad", ["1ABC", "A-B", "*", "A*B", "A B"])
def test_task_env_allow_patterns_are_checked(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="--task-env-allow"):
        parse_allow(bad)
