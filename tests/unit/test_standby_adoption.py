"""Whether a standby could adopt the leader's tasks (standby.adoption_refusal), from what each recorded of itself:
on the local backend only on the leader's machine with its data dir; on Mesos anywhere; never with another backend."""

from __future__ import annotations

import stat
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from peloton.leadership.owner import Owner
from peloton.leadership.standby import DATA_DIR_ID_FILE, adoption_refusal, data_dir_id, machine_id

LEADER = Owner("node-a", 4242, "node-a:5391", time.time(), "peloton-abc", 6.0, backend="local",
               machine="boot-1/pid:1", data_dir="/var/lib/peloton", data_dir_id="id-a")


def me(**kw: Any) -> Owner:
    return replace(Owner("node-a", 4343, "node-a:5391", time.time(), "peloton-def", 6.0, backend="local",
                         machine="boot-1/pid:1", data_dir="/var/lib/peloton", data_dir_id="id-a"), **kw)


def test_the_same_machine_and_data_dir_adopts() -> None:
    assert adoption_refusal(me(), LEADER) is None


def test_another_data_dir_is_refused_naming_both() -> None:
    e = adoption_refusal(me(data_dir="/srv/peloton-b", data_dir_id="id-b"), LEADER)
    assert e is not None and e.field == "--data-dir"
    assert "the leader's data dir /var/lib/peloton" in e.message and "--data-dir /srv/peloton-b is another" in e.message
    assert "pid 4242 on host node-a" in e.message and "docs/running.md#a-leader-and-standbys" in e.message
    # the same path, but another directory (made again, or another mount): its id says so
    e = adoption_refusal(me(data_dir_id="id-b"), LEADER)
    assert e is not None and "another directory (another daemon.id)" in e.message


def test_another_machine_is_refused() -> None:
    e = adoption_refusal(me(machine="boot-2/pid:1"), LEADER)
    assert e is not None and e.field == "--standby" and "runs on another machine" in e.message
    assert "Mesos backend" in e.message


def test_another_backend_is_refused() -> None:
    e = adoption_refusal(me(backend="sim", machine="", data_dir="", data_dir_id=""), LEADER)
    assert e is not None and e.field == "--backend"
    assert "runs the local backend, and this daemon the sim one" in e.message


@pytest.mark.parametrize("backend", ["mesos", "sim"])
def test_a_standby_elsewhere_is_fine_off_the_local_backend(backend: str) -> None:
    leader = replace(LEADER, backend=backend, machine="", data_dir="", data_dir_id="")
    assert adoption_refusal(Owner("node-b", 1, "node-b:5391", time.time(), backend=backend), leader) is None


def test_nothing_to_judge_is_no_refusal() -> None:
    assert adoption_refusal(me(), None) is None  # no leader recorded yet
    assert adoption_refusal(me(), replace(LEADER, backend="")) is None  # a leader of an earlier release
    no_hostmgr = Owner("node-b", 1, "node-b:5391", time.time())  # a --role jobmgr standby: runs no backend
    assert adoption_refusal(no_hostmgr, LEADER) is None


def test_the_owner_record_keeps_what_it_runs_and_reads_an_earlier_releases() -> None:
    assert Owner.from_json(LEADER.to_json()) == LEADER
    old = '{"host": "node-a", "pid": 1, "address": "a:1", "since": 1.0, "session": "s", "lease": 6.0}'
    o = Owner.from_json(old)
    assert o is not None and (o.backend, o.machine, o.data_dir, o.data_dir_id) == ("", "", "", "")


def test_the_data_dir_id_is_made_once_owner_only_and_kept(tmp_path: Path) -> None:
    first = data_dir_id(tmp_path)
    assert len(first) == 32 and data_dir_id(tmp_path) == first
    assert stat.S_IMODE((tmp_path / DATA_DIR_ID_FILE).stat().st_mode) == 0o600
    other = tmp_path / "other"
    other.mkdir()
    assert data_dir_id(other) != first
    (other / DATA_DIR_ID_FILE).write_text("")  # a daemon died between making and writing it
    assert len(data_dir_id(other)) == 32


def test_the_machine_is_this_boot_and_pid_namespace() -> None:
    assert machine_id() == machine_id()
    assert "/pid:" in machine_id() or machine_id().startswith("host:")
