"""The environment handed to gang members: ranks, world size, master, hosts/slots, peers, hostfile."""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.domain.placement import MemberAssignment
from peloton.domain.resources import Resources
from peloton.jobmgr.training_env import hostfile, training_env

R = Resources(1, 1024)


def member(instance: int, address: str, ports: tuple[int, ...] = (), host: str | None = None) -> MemberAssignment:
    return MemberAssignment(
        instance=instance,
        task_id=f"job-{instance}-2",
        hostname=host or address,
        address=address,
        resources=R,
        ports=ports,
    )


# Given out of instance order on purpose: rank follows instance, not list position.
MEMBERS = [
    member(3, "10.0.0.2", (5003, 6003)),
    member(0, "10.0.0.1", (5000,)),
    member(2, "10.0.0.1", (5002,)),
    member(1, "10.0.0.2", (5001,)),
]


def test_every_member_gets_an_env() -> None:
    env = training_env("job", 2, MEMBERS)
    assert sorted(env) == [0, 1, 2, 3]
    for inst, e in env.items():
        assert e["PELOTON_JOB_ID"] == "job"
        assert e["PELOTON_TASK_ID"] == f"job-{inst}-2"
        assert e["PELOTON_INSTANCE"] == str(inst)
        assert e["PELOTON_ATTEMPT"] == "2"
        assert "PELOTON_HOSTFILE" not in e  # set by the caller, which writes the file


def test_ranks_follow_instance_order() -> None:
    env = training_env("job", 1, MEMBERS)
    for inst in range(4):
        assert env[inst]["PELOTON_RANK"] == str(inst) == env[inst]["RANK"]
    sparse = training_env("job", 1, [member(7, "a"), member(2, "b"), member(9, "c")])
    assert {i: e["RANK"] for i, e in sparse.items()} == {2: "0", 7: "1", 9: "2"}


def test_world_size() -> None:
    for e in training_env("job", 1, MEMBERS).values():
        assert e["PELOTON_WORLD_SIZE"] == "4" == e["WORLD_SIZE"]


def test_master_is_rank_zero() -> None:
    for e in training_env("job", 1, MEMBERS).values():
        assert e["MASTER_ADDR"] == "10.0.0.1"
        assert e["MASTER_PORT"] == "5000"


def test_master_port_omitted_without_ports() -> None:
    env = training_env("job", 1, [member(0, "10.0.0.1"), member(1, "10.0.0.2", (7000,))])
    for e in env.values():
        assert e["MASTER_ADDR"] == "10.0.0.1"
        assert "MASTER_PORT" not in e
    assert env[0]["PELOTON_PEERS"] == "10.0.0.1,10.0.0.2:7000"
    assert env[0]["PELOTON_PORTS"] == ""


def test_hosts_slots_in_order_of_first_appearance() -> None:
    env = training_env("job", 1, MEMBERS)
    assert {e["PELOTON_HOSTS"] for e in env.values()} == {"10.0.0.1:2,10.0.0.2:2"}
    mixed = [member(0, "b"), member(1, "a"), member(2, "b"), member(3, "c")]
    assert training_env("job", 1, mixed)[0]["PELOTON_HOSTS"] == "b:2,a:1,c:1"


def test_local_backend_shares_one_address() -> None:
    members = [member(i, "127.0.0.1", (9000 + i,), host=f"local-{i}") for i in range(4)]
    env = training_env("job", 1, members)
    assert env[0]["PELOTON_HOSTS"] == "127.0.0.1:4"
    # each simulated host is its own node for LOCAL_RANK, though all share one address
    assert [env[i]["LOCAL_RANK"] for i in range(4)] == ["0", "0", "0", "0"]
    assert {env[i]["LOCAL_WORLD_SIZE"] for i in range(4)} == {"1"}
    assert hostfile(members) == "127.0.0.1 slots=4\n"
    two = [member(i, "127.0.0.1", (9000 + i,), host=f"local-{i % 2}") for i in range(4)]
    env2 = training_env("job", 1, two)
    assert [env2[i]["LOCAL_RANK"] for i in range(4)] == ["0", "0", "1", "1"]


def test_local_rank_and_local_world_size() -> None:
    env = training_env("job", 1, MEMBERS)
    assert [env[i]["LOCAL_RANK"] for i in range(4)] == ["0", "0", "1", "1"]
    assert [env[i]["LOCAL_WORLD_SIZE"] for i in range(4)] == ["2", "2", "2", "2"]
    mixed = [member(0, "b"), member(1, "a"), member(2, "b"), member(3, "b")]
    env = training_env("job", 1, mixed)
    assert [env[i]["LOCAL_RANK"] for i in range(4)] == ["0", "0", "1", "2"]
    assert [env[i]["LOCAL_WORLD_SIZE"] for i in range(4)] == ["3", "1", "3", "3"]


def test_peers_in_rank_order_with_first_port() -> None:
    env = training_env("job", 1, MEMBERS)
    assert env[2]["PELOTON_PEERS"] == "10.0.0.1:5000,10.0.0.2:5001,10.0.0.1:5002,10.0.0.2:5003"


def test_ports_of_this_member() -> None:
    env = training_env("job", 1, MEMBERS)
    assert env[3]["PELOTON_PORTS"] == "5003,6003"
    assert env[0]["PELOTON_PORTS"] == "5000"


def test_hostfile_format() -> None:
    assert hostfile(MEMBERS) == "10.0.0.1 slots=2\n10.0.0.2 slots=2\n"
    assert hostfile([member(5, "x"), member(1, "y"), member(3, "x")]) == "y slots=1\nx slots=2\n"
    assert hostfile([]) == ""


def test_empty_gang() -> None:
    assert training_env("job", 1, []) == {}


@settings(max_examples=200, deadline=None)
@given(
    placement=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.lists(st.integers(1024, 65535), max_size=3)),
        min_size=1,
        max_size=12,
    ),
    perm=st.randoms(use_true_random=False),
)
def test_property_ranks_and_slots_consistent(placement: list[tuple[str, list[int]]], perm: random.Random) -> None:
    members = [member(i * 3, addr, tuple(ports)) for i, (addr, ports) in enumerate(placement)]
    shuffled = list(members)
    perm.shuffle(shuffled)
    env = training_env("j", 1, shuffled)
    assert env == training_env("j", 1, members)
    n = len(members)
    assert sorted(int(e["RANK"]) for e in env.values()) == list(range(n))
    slots = dict((part.rsplit(":", 1)[0], int(part.rsplit(":", 1)[1])) for part in env[0]["PELOTON_HOSTS"].split(","))
    assert sum(slots.values()) == n
    lines = hostfile(shuffled).splitlines()
    assert [f"{a} slots={c}" for a, c in slots.items()] == lines
    for m in members:
        e = env[m.instance]
        assert int(e["LOCAL_WORLD_SIZE"]) == slots[m.address]
        assert 0 <= int(e["LOCAL_RANK"]) < slots[m.address]
        assert e["PELOTON_PEERS"].split(",")[int(e["RANK"])] == (f"{m.address}:{m.ports[0]}" if m.ports else m.address)


def test_env_files_are_read_by_the_member_itself(tmp_path: Path) -> None:
    import subprocess

    from peloton.jobmgr.training_env import with_env_files

    odd = tmp_path / "it's a secret"
    odd.write_text("s3cr3t 'quoted' $HOME\n")
    (tmp_path / "b").write_text("two")
    cmd = with_env_files('echo "[$API_KEY] [$B]"', {"API_KEY": str(odd), "B": str(tmp_path / "b")})
    assert "s3cr3t" not in cmd  # the command carries paths, never values
    r = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and r.stdout == "[s3cr3t 'quoted' $HOME] [two]\n"
    missing = with_env_files("echo never", {"TOKEN": str(tmp_path / "nope")})
    r = subprocess.run(["/bin/sh", "-c", missing], capture_output=True, text=True)
    assert r.returncode == 126 and r.stdout == "" and "peloton: cannot read TOKEN from" in r.stderr
    assert with_env_files("true", {}) == "true"
