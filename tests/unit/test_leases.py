"""LeaseBook: offers are free resources minus live holds; leases shrink, are consumed, released and expire."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peloton.domain.placement import HostOffer, MemberAssignment
from peloton.domain.resources import Resources
from peloton.errors import Conflict
from peloton.hostmgr.leases import LeaseBook

NOW = 500.0
LEASE_S = 10.0


def offer(host: str, cpu: float = 8, mem: float = 8192, gpus: tuple[int, ...] = (0, 1, 2, 3),
          ports: tuple[int, ...] = (31000, 31001, 31002, 31003)) -> HostOffer:
    free = Resources(cpu=cpu, mem=mem, gpu=len(gpus), ports=len(ports))
    return HostOffer(host, f"10.0.0.{host[-1]}", free, gpus, ports, {}, free, bool(gpus))


FREE = [offer("h1"), offer("h2")]


def member(host: str, i: int = 0, cpu: float = 1, mem: float = 512, gpus: tuple[int, ...] = (),
           ports: tuple[int, ...] = ()) -> MemberAssignment:
    return MemberAssignment(i, f"j-{i}-1", host, "", Resources(cpu=cpu, mem=mem, gpu=len(gpus), ports=len(ports)),
                            gpus, ports)


def by_host(offers: list[HostOffer]) -> dict[str, HostOffer]:
    return {o.hostname: o for o in offers}


def test_first_acquire_offers_everything_free() -> None:
    book = LeaseBook()
    lid, offers = book.acquire(FREE, NOW, LEASE_S)
    assert lid and offers == FREE
    assert book.held_hosts() == {"h1", "h2"}


def test_a_second_acquire_sees_nothing_while_the_first_holds_everything() -> None:
    book = LeaseBook()
    book.acquire(FREE, NOW, LEASE_S)
    lid2, offers = book.acquire(FREE, NOW + 1, LEASE_S)
    for o in offers:
        assert o.gpu_ids == () and o.ports == ()
        assert o.free == Resources(0, 0, 0, 0, 0)
    assert lid2


def test_retain_shrinks_the_lease_and_frees_the_rest() -> None:
    book = LeaseBook()
    lid, _ = book.acquire(FREE, NOW, LEASE_S)
    keep = [member("h1", 0, cpu=2, mem=1024, gpus=(1,), ports=(31002,))]
    book.retain(lid, keep, NOW + 1)
    assert book.held_hosts() == {"h1"}
    _, offers = book.acquire(FREE, NOW + 2, LEASE_S)
    o = by_host(offers)
    assert o["h1"].gpu_ids == (0, 2, 3) and o["h1"].ports == (31000, 31001, 31003)
    assert o["h1"].free == Resources(cpu=6, mem=7168, gpu=3, ports=3)
    assert o["h2"] == FREE[1]


def test_retain_nothing_drops_the_lease() -> None:
    book = LeaseBook()
    lid, _ = book.acquire(FREE, NOW, LEASE_S)
    book.retain(lid, [], NOW + 1)
    assert book.held_hosts() == set()
    with pytest.raises(Conflict):
        book.consume(lid, [member("h1")], NOW + 1)
    _, offers = book.acquire(FREE, NOW + 2, LEASE_S)
    assert offers == FREE


def test_retain_of_an_expired_lease_drops_it() -> None:
    book = LeaseBook()
    lid, _ = book.acquire(FREE, NOW, LEASE_S)
    book.retain(lid, [member("h1", gpus=(0,))], NOW + LEASE_S)
    assert book.held_hosts() == set()
    with pytest.raises(Conflict, match="expired or unknown"):
        book.consume(lid, [member("h1", gpus=(0,))], NOW + 1)


def test_consume_of_held_resources_ends_the_hold() -> None:
    book = LeaseBook()
    lid, _ = book.acquire(FREE, NOW, LEASE_S)
    ms = [member("h1", 0, cpu=2, gpus=(0, 1), ports=(31000,)), member("h2", 1, cpu=2, gpus=(3,), ports=(31003,))]
    book.retain(lid, ms, NOW + 1)
    book.consume(lid, ms, NOW + 2)
    assert book.held_hosts() == set()
    # the lease is gone: consuming again is a conflict
    with pytest.raises(Conflict):
        book.consume(lid, ms, NOW + 3)


def test_partial_consume_keeps_the_rest_held() -> None:
    book = LeaseBook()
    lid, _ = book.acquire(FREE, NOW, LEASE_S)
    a, b = member("h1", 0, gpus=(0,)), member("h2", 1, gpus=(1,))
    book.retain(lid, [a, b], NOW + 1)
    book.consume(lid, [a], NOW + 2)
    assert book.held_hosts() == {"h2"}
    book.consume(lid, [b], NOW + 3)
    assert book.held_hosts() == set()


@pytest.mark.parametrize("bad", [
    member("h3", gpus=(0,)),  # host not in the lease
    member("h1", gpus=(2,)),  # gpu not held
    member("h1", ports=(31003,)),  # port not held
])
def test_consume_of_resources_not_held_is_a_conflict(bad: MemberAssignment) -> None:
    book = LeaseBook()
    lid, _ = book.acquire(FREE, NOW, LEASE_S)
    book.retain(lid, [member("h1", gpus=(0, 1), ports=(31000,))], NOW + 1)
    with pytest.raises(Conflict, match="does not hold"):
        book.consume(lid, [bad], NOW + 2)
    # nothing was taken: the rightful member still consumes
    book.consume(lid, [member("h1", gpus=(0, 1), ports=(31000,))], NOW + 2)


def test_consume_checks_every_member_before_taking_any() -> None:
    book = LeaseBook()
    lid, _ = book.acquire(FREE, NOW, LEASE_S)
    good = member("h1", 0, gpus=(0,))
    book.retain(lid, [good], NOW + 1)
    with pytest.raises(Conflict):
        book.consume(lid, [good, member("h1", 1, gpus=(3,))], NOW + 2)
    book.consume(lid, [good], NOW + 2)  # still held



def test_consume_of_more_cpu_than_held_is_a_conflict() -> None:
    book = LeaseBook()
    lid, _ = book.acquire(FREE, NOW, LEASE_S)
    book.retain(lid, [member("h1", cpu=1, mem=512), member("h2", cpu=1, mem=512)], NOW + 1)
    with pytest.raises(Conflict):
        book.consume(lid, [member("h1", cpu=6, mem=8000)], NOW + 2)


def test_unknown_lease_is_a_conflict() -> None:
    with pytest.raises(Conflict, match="expired or unknown"):
        LeaseBook().consume("feedfacefeedface", [member("h1")], NOW)


def test_expired_lease_is_a_conflict_and_frees_its_resources() -> None:
    book = LeaseBook()
    lid, _ = book.acquire(FREE, NOW, LEASE_S)
    m = member("h1", gpus=(0,))
    book.retain(lid, [m], NOW + 1)
    with pytest.raises(Conflict, match="expired"):
        book.consume(lid, [m], NOW + LEASE_S)  # expires_at <= now
    _, offers = book.acquire(FREE, NOW + LEASE_S, LEASE_S)
    assert offers == FREE


def test_expire_with_the_clock_passed_in() -> None:
    book = LeaseBook()
    a, _ = book.acquire([offer("h1")], NOW, 5)
    b, _ = book.acquire([offer("h2")], NOW, 20)
    assert book.expire(NOW + 4.999) == []
    assert book.expire(NOW + 5) == [a]
    assert book.held_hosts() == {"h2"}
    assert book.expire(NOW + 19) == []
    assert book.expire(NOW + 20) == [b]
    assert book.held_hosts() == set()


def test_acquire_expires_stale_leases_first() -> None:
    book = LeaseBook()
    book.acquire(FREE, NOW, LEASE_S)
    _, offers = book.acquire(FREE, NOW + LEASE_S + 1, LEASE_S)
    assert offers == FREE


def test_release_all_and_part() -> None:
    book = LeaseBook()
    lid, _ = book.acquire(FREE, NOW, LEASE_S)
    a, b = member("h1", 0, cpu=2, gpus=(0,)), member("h2", 1, cpu=2, ports=(31001,))
    book.retain(lid, [a, b], NOW)
    book.release(lid, [a])
    assert book.held_hosts() == {"h2"}
    _, offers = book.acquire(FREE, NOW + 1, LEASE_S)
    assert 0 in by_host(offers)["h1"].gpu_ids and 31001 not in by_host(offers)["h2"].ports
    book.release(lid)
    book.release(lid)  # unknown now: ignored
    book.release("nonexistent", [a])


def test_release_of_members_not_held_is_ignored() -> None:
    book = LeaseBook()
    lid, _ = book.acquire(FREE, NOW, LEASE_S)
    book.retain(lid, [member("h1", gpus=(0,))], NOW)
    book.release(lid, [member("h1", gpus=(3,))])
    assert book.held_hosts() == {"h1"}


def test_two_leases_never_overlap_in_gpus_or_ports() -> None:
    book = LeaseBook()
    l1, o1 = book.acquire(FREE, NOW, LEASE_S)
    book.retain(l1, [member("h1", 0, gpus=(0, 2), ports=(31000,)), member("h2", 1, gpus=(1,), ports=(31003,))], NOW)
    l2, o2 = book.acquire(FREE, NOW + 1, LEASE_S)
    o2h = by_host(o2)
    assert set(o2h["h1"].gpu_ids) == {1, 3} and set(o2h["h1"].ports) == {31001, 31002, 31003}
    assert set(o2h["h2"].gpu_ids) == {0, 2, 3} and set(o2h["h2"].ports) == {31000, 31001, 31002}
    assert o2h["h1"].free.gpu == 2 and o2h["h1"].free.ports == 3 and o2h["h1"].free.cpu == 7
    # a third sees what neither holds
    _, o3 = book.acquire(FREE, NOW + 2, LEASE_S)
    assert all(o.gpu_ids == () and o.ports == () for o in o3)
    assert l1 != l2


def test_offer_of_a_host_not_held_passes_through_unchanged() -> None:
    book = LeaseBook()
    lid, _ = book.acquire([offer("h1")], NOW, LEASE_S)
    _, offers = book.acquire([offer("h1"), offer("h2")], NOW + 1, LEASE_S)
    assert by_host(offers)["h2"] == offer("h2")


# --- Hypothesis: concurrent leases never hand out the same GPU or port -----------------------------------------
HOSTS = [offer("h1", gpus=(0, 1, 2, 3), ports=tuple(range(31000, 31006))),
         offer("h2", gpus=(0, 1), ports=tuple(range(32000, 32004)))]

lease_op = st.one_of(
    st.tuples(st.just("acquire"), st.floats(0.5, 30)),
    st.tuples(st.just("retain"), st.integers(0, 20), st.lists(st.booleans(), min_size=16, max_size=16)),
    st.tuples(st.just("consume"), st.integers(0, 20), st.lists(st.booleans(), min_size=16, max_size=16)),
    st.tuples(st.just("release"), st.integers(0, 20), st.booleans()),
    st.tuples(st.just("tick"), st.floats(0, 10)),
)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(lease_op, max_size=40))
def test_concurrent_leases_never_share_a_gpu_or_port(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    book = LeaseBook()
    now = NOW
    # what each lease was offered (and so may keep), and what is in use by launched tasks
    offered: dict[str, dict[str, HostOffer]] = {}
    in_use: dict[str, tuple[set[int], set[int]]] = {h.hostname: (set(), set()) for h in HOSTS}

    def free_now() -> list[HostOffer]:
        out = []
        for h in HOSTS:
            g_used, p_used = in_use[h.hostname]
            gpus = tuple(g for g in h.gpu_ids if g not in g_used)
            ports = tuple(p for p in h.ports if p not in p_used)
            out.append(HostOffer(h.hostname, h.address, Resources(8, 8192, 0, len(gpus), len(ports)), gpus, ports))
        return out

    def pick(o: dict[str, HostOffer], mask: list[bool]) -> list[MemberAssignment]:
        ms = []
        k = 0
        for i, h in enumerate(sorted(o)):
            gpus = tuple(g for j, g in enumerate(o[h].gpu_ids) if mask[(j + 4 * i) % 16])
            ports = tuple(p for j, p in enumerate(o[h].ports) if mask[(j + 8 + 4 * i) % 16])
            if gpus or ports:
                ms.append(member(h, k, cpu=0.5, mem=1, gpus=gpus, ports=ports))
                k += 1
        return ms

    def forget(lid: str, ms: list[MemberAssignment]) -> None:
        """A later retain keeps only what the lease still holds (as the placement engine's would)."""
        for m in ms:
            o = offered[lid][m.hostname]
            offered[lid][m.hostname] = HostOffer(o.hostname, "", o.free,
                                                 tuple(g for g in o.gpu_ids if g not in m.gpu_ids),
                                                 tuple(p for p in o.ports if p not in m.ports))

    for op in ops:
        kind = op[0]
        ids = sorted(offered)
        if kind == "acquire":
            lid, offers = book.acquire(free_now(), now, op[1])
            live = set(book._leases)  # noqa: SLF001 - checking the invariant directly
            for o in offers:
                g_used, p_used = in_use[o.hostname]
                assert not set(o.gpu_ids) & g_used and not set(o.ports) & p_used
                for other in live - {lid}:
                    held = book._leases[other].holds.get(o.hostname)  # noqa: SLF001
                    if held is not None:
                        assert not set(o.gpu_ids) & held.gpu_ids, (o, held)
                        assert not set(o.ports) & held.ports, (o, held)
            offered[lid] = {o.hostname: o for o in offers}
        elif kind in ("retain", "consume") and ids:
            lid = ids[op[1] % len(ids)]
            ms = pick(offered[lid], op[2])
            if kind == "retain":
                book.retain(lid, ms, now)
                if lid in book._leases:  # noqa: SLF001
                    offered[lid] = {m.hostname: HostOffer(m.hostname, "", m.resources, m.gpu_ids, m.ports)
                                    for m in ms}
            else:
                try:
                    book.consume(lid, ms, now)
                except Conflict:
                    pass
                else:
                    for m in ms:
                        g_used, p_used = in_use[m.hostname]
                        assert not set(m.gpu_ids) & g_used and not set(m.ports) & p_used, "handed out twice"
                        g_used.update(m.gpu_ids)
                        p_used.update(m.ports)
                    forget(lid, ms)
        elif kind == "release" and ids:
            lid = ids[op[1] % len(ids)]
            if op[2]:
                ms = pick(offered[lid], [True] * 16)
                book.release(lid, ms)
                forget(lid, ms)
            else:
                book.release(lid)
                del offered[lid]
        elif kind == "tick":
            now += op[1]
        # invariant: live leases hold disjoint GPU ids and ports, and none that launched tasks use
        seen: dict[str, tuple[set[int], set[int]]] = {h.hostname: (set(), set()) for h in HOSTS}
        for lease in book._leases.values():  # noqa: SLF001
            for host, hold in lease.holds.items():
                g_seen, p_seen = seen[host]
                assert not hold.gpu_ids & g_seen and not hold.ports & p_seen
                assert not hold.gpu_ids & in_use[host][0] and not hold.ports & in_use[host][1]
                g_seen.update(hold.gpu_ids)
                p_seen.update(hold.ports)
