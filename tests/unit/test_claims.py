"""ClaimBook: a placed gang's resources held whole on its hosts until launch, with concrete GPU ids and ports."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.domain.launch import LaunchSpec
from peloton.domain.placement import GangPlacement, HostOffer, MemberAssignment
from peloton.domain.resources import Resources
from peloton.hostmgr.claims import ClaimBook

NOW = 100.0


def offer(name: str, cpu: float = 8, gpus: int = 4, ports: int = 4, port_base: int = 31000) -> HostOffer:
    free = Resources(cpu, 1024, 0, gpus, ports)
    return HostOffer(name, f"addr-{name}", free, tuple(range(gpus)), tuple(range(port_base, port_base + ports)),
                     {}, free, gpus > 0)


def placement(gang: str, hosts: list[str], cpu: float = 1, gpu: int = 1, ports: int = 1, attempt: int = 1
              ) -> GangPlacement:
    r = Resources(cpu, 64, 0, gpu, ports)
    return GangPlacement(gang, gang.split("/")[0], attempt, tuple(
        MemberAssignment(i, f"{gang.split('/')[0]}-{i}-{attempt}", h, "", r) for i, h in enumerate(hosts)))


def specs(p: GangPlacement) -> list[LaunchSpec]:
    return [LaunchSpec(m.task_id, p.job_id, m.instance, p.attempt, m.hostname, "true", {}, m.resources, m.gpu_ids,
                       m.ports) for m in p.members]


def test_claim_assigns_the_lowest_free_ids_and_the_hosts_address() -> None:
    book = ClaimBook()
    offers = {"h1": offer("h1"), "h2": offer("h2")}
    got = book.claim(placement("a/0", ["h1", "h1", "h2"]), offers, NOW, 60)
    assert isinstance(got, GangPlacement)
    assert [(m.hostname, m.address, m.gpu_ids, m.ports) for m in got.members] == [
        ("h1", "addr-h1", (0,), (31000,)), ("h1", "addr-h1", (1,), (31001,)), ("h2", "addr-h2", (0,), (31000,))]
    again = book.claim(placement("b/0", ["h1"]), offers, NOW, 60)
    assert isinstance(again, GangPlacement) and again.members[0].gpu_ids == (2,)  # what a holds is not offered
    assert book.free(offers["h1"]).free == Resources(5, 1024 - 192, 0, 1, 1)


def test_a_gang_that_no_longer_fits_is_refused_whole() -> None:
    book = ClaimBook()
    offers = {"h1": offer("h1", gpus=2), "h2": offer("h2", gpus=2)}
    assert isinstance(book.claim(placement("a/0", ["h2", "h2"]), offers, NOW, 60), GangPlacement)
    why = book.claim(placement("b/0", ["h1", "h2"]), offers, NOW, 60)
    assert isinstance(why, str) and "h2" in why and "gpu" in why
    assert book.held("h1") is None  # nothing of b is held
    assert book.claim(placement("c/0", ["h9"]), offers, NOW, 60) == "host h9 is gone"
    assert "already claimed" in str(book.claim(placement("a/0", ["h1"]), offers, NOW, 60))


def test_release_and_expiry_give_everything_back() -> None:
    book = ClaimBook()
    offers = {"h1": offer("h1")}
    p = book.claim(placement("a/0", ["h1"]), offers, NOW, 60)
    assert isinstance(p, GangPlacement)
    assert book.expire(NOW + 59) == set() and len(book) == 1
    assert book.expire(NOW + 60) == {"h1"} and len(book) == 0 and book.held("h1") is None
    book.claim(placement("a/0", ["h1"]), offers, NOW, 60)
    assert book.release(("a/0", 1)) == {"h1"} and book.release(("a/0", 1)) == set()
    assert book.free(offers["h1"]) == offers["h1"]


def test_a_launch_must_match_its_live_claim_and_pins_it() -> None:
    book = ClaimBook()
    offers = {"h1": offer("h1")}
    p = book.claim(placement("a/0", ["h1", "h1"]), offers, NOW, 60)
    assert isinstance(p, GangPlacement)
    wrong = specs(p)
    wrong[1] = LaunchSpec(wrong[1].task_id, "a", 1, 1, "h1", "true", {}, wrong[1].resources, (3,), wrong[1].ports)
    assert "does not match" in str(book.begin_launch(("a/0", 1), wrong, NOW))
    assert "members" in str(book.begin_launch(("a/0", 1), specs(p)[:1], NOW))
    assert book.begin_launch(("a/0", 1), specs(p), NOW) is None
    assert "already being launched" in str(book.begin_launch(("a/0", 1), specs(p), NOW))
    assert book.expire(NOW + 1000) == set()  # a launch in progress never expires
    assert book.release(("a/0", 1)) == {"h1"}
    assert "expired or is unknown" in str(book.begin_launch(("a/0", 1), specs(p), NOW))
    late = book.claim(placement("b/0", ["h1"]), offers, NOW, 60)
    assert isinstance(late, GangPlacement)
    assert "expired" in str(book.begin_launch(("b/0", 1), specs(late), NOW + 61))
    assert book.held("h1") is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from(["h1", "h2", "h3"]), min_size=1, max_size=4),
                          st.integers(0, 2), st.integers(0, 2), st.sampled_from(["claim", "claim", "release"])),
                max_size=25))
def test_nothing_is_ever_held_twice(ops: list[tuple[list[str], int, int, str]]) -> None:
    """Whatever the order of claims and releases: no GPU id or port is held by two claims, nothing beyond what
    the hosts offer is held, and releasing everything leaves nothing held."""
    book = ClaimBook()
    offers = {h: offer(h, cpu=4, gpus=3, ports=3) for h in ("h1", "h2", "h3")}
    live: dict[tuple[str, int], GangPlacement] = {}
    for n, (hosts, gpu, ports, op) in enumerate(ops):
        if op == "release" and live:
            key = sorted(live)[0]
            book.release(key)
            del live[key]
            continue
        got = book.claim(placement(f"g{n}/0", hosts, cpu=1, gpu=gpu, ports=ports), offers, NOW, 60)
        if isinstance(got, GangPlacement):
            live[(got.gang_id, got.attempt)] = got
        for h, o in offers.items():
            members = [m for p in live.values() for m in p.members if m.hostname == h]
            gpus = [g for m in members for g in m.gpu_ids]
            held_ports = [q for m in members for q in m.ports]
            assert len(gpus) == len(set(gpus)) and set(gpus) <= set(o.gpu_ids)
            assert len(held_ports) == len(set(held_ports)) and set(held_ports) <= set(o.ports)
            assert sum(m.resources.cpu for m in members) <= o.free.cpu + 1e-9
    for key in list(live):
        book.release(key)
    assert all(book.held(h) is None for h in offers) and len(book) == 0


def test_a_claim_takes_only_the_ids_it_asks_for_after_those_held() -> None:
    """The ids are picked from the offer's lists, skipping what other claims hold, only as many as asked: a gang
    without ports holds none, and one asking for more than are left is refused for ports."""
    book = ClaimBook()
    offers = {"h1": offer("h1", gpus=4, ports=4)}
    a = book.claim(placement("a/0", ["h1"], gpu=2, ports=3), offers, NOW, 60)
    assert isinstance(a, GangPlacement) and (a.members[0].gpu_ids, a.members[0].ports) == ((0, 1), (31000, 31001,
                                                                                                   31002))
    none = book.claim(placement("b/0", ["h1"], gpu=0, ports=0), offers, NOW, 60)
    assert isinstance(none, GangPlacement) and (none.members[0].gpu_ids, none.members[0].ports) == ((), ())
    why = book.claim(placement("c/0", ["h1"], gpu=1, ports=2), offers, NOW, 60)
    assert isinstance(why, str) and "short of ports" in why and "gpu" not in why.split("short of")[1]
    d = book.claim(placement("d/0", ["h1"], gpu=2, ports=1), offers, NOW, 60)
    assert isinstance(d, GangPlacement) and (d.members[0].gpu_ids, d.members[0].ports) == ((2, 3), (31003,))
