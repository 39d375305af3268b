"""The free state of every host, indexed for placement and updated incrementally between rounds.

Pure: no I/O, no clock, no threads. The placement engine keeps one `HostIndex` across rounds: the host manager's
authoritative free states arrive through `upsert`/`remove`, `place` deducts what it decides, and `release` gives
back a placement whose claim was refused.

Why an index: a cluster of 10,000 hosts holds far fewer distinct free states. Hosts are grouped into equivalence
classes by their exact free vector (cpu, mem, disk, GPU count, port count) plus whether they have GPUs at all, so
the placer compares classes (typically tens to a few hundred) instead of hosts. Every host of a class is equally good
on resources, so within a class the placer only needs "the lowest hostname" or "the lowest hostname in one of these
racks": each class keeps its hostnames sorted, overall and per rack (`SortedNames`, chunked so that a class of
tens of thousands of hosts does not cost a memmove of all of them per change), and a host whose state changes
moves from one class to another. There is no lazy deletion: after any sequence of operations the structure is
exactly the one a rebuild from the same free states gives. Each tier (GPU hosts or not) also keeps its classes
ordered by how much they have free, for spread. A label index ((key, value) -> hosts) lets a gang with an
`eq`/`in`/`exists` constraint start from the hosts it allows instead of testing every host.

Quantities are kept in fixed point (millionths of a core and of a MiB) so that deducting and giving back is exact
and equal free states always land in the same class; `get`/`offers` convert back to `Resources`. GPU and port
counts are the offer's counts: concrete GPU ids and ports are the host manager's business and are not kept here.

Nothing here iterates a set where the order could show: results are sorted by hostname, so hash randomisation
cannot change a placement.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, KeysView
from math import lcm

from peloton.domain.placement import GangPlacement, HostOffer
from peloton.domain.resources import Resources
from peloton.domain.spec import Constraint

__all__ = ["HostIndex", "HostState", "HostClass", "ClassView", "Vec", "ClassKey", "Weights", "to_vec", "UNIT"]

UNIT = 1_000_000  # fixed-point units per core and per MiB
Vec = tuple[int, int, int, int, int]  # cpu, mem, disk (fixed point), gpu count, port count
ClassKey = tuple[bool, int, int, int, int, int]  # has_gpus + Vec
Weights = tuple[int, int, int, int]  # per unit of cpu, mem, disk, gpu: makes them one comparable (exact) number
_Order = list[tuple[int, ClassKey, "HostClass"]]  # (-score, key, class), ascending: most free first
_ELIGIBLE_CACHE_MAX = 1024
SHAPES_MAX = 4096  # member sizes with a shape id (and a count cached per class) before the caches start again
_CHUNK = 256  # SortedNames splits a chunk grown past twice this


def to_vec(r: Resources) -> Vec:
    return (round(r.cpu * UNIT), round(r.mem * UNIT), round(r.disk * UNIT), r.gpu, r.ports)


def _to_resources(v: Vec) -> Resources:
    return Resources(v[0] / UNIT, v[1] / UNIT, v[2] / UNIT, v[3], v[4])


class HostState:
    """One host as the index knows it. The placer reads it; only the index files it into classes. While a gang is
    being tried the placer takes a host out of its class (`ClassView.take`) and may change its free fields; the
    index files it again under its new state when the gang is settled."""

    __slots__ = (
        "name",
        "address",
        "labels",
        "rack",
        "capacity",
        "has_gpus",
        "cpu",
        "mem",
        "disk",
        "gpu",
        "ports",
        "cls",
    )

    def __init__(
        self, name: str, address: str, labels: dict[str, str], rack: str, capacity: Vec, has_gpus: bool, free: Vec
    ) -> None:
        self.name = name
        self.address = address
        self.labels = labels
        self.rack = rack  # "" when the host has no rack label: such hosts share no rack with anyone
        self.capacity = capacity
        self.has_gpus = has_gpus
        self.cpu, self.mem, self.disk, self.gpu, self.ports = free
        self.cls: HostClass | None = None

    def free(self) -> Vec:
        return (self.cpu, self.mem, self.disk, self.gpu, self.ports)

    def key(self) -> ClassKey:
        return (self.has_gpus, self.cpu, self.mem, self.disk, self.gpu, self.ports)


class HostClass:
    """Hosts with exactly the same free vector and GPU-ness. Its vector never changes (a host whose free state
    changes moves to another class), so what is derived from the vector can be cached on it."""

    __slots__ = (
        "key",
        "has_gpus",
        "cpu",
        "mem",
        "disk",
        "gpu",
        "ports",
        "names",
        "racks",
        "caps",
        "base",
        "score",
    )

    def __init__(self, key: ClassKey, weights: Weights, caps: dict[int, int] | None = None) -> None:
        self.key = key
        self.has_gpus, self.cpu, self.mem, self.disk, self.gpu, self.ports = key
        self.names = SortedNames()
        self.racks: dict[str, SortedNames] = {}  # only hosts with a rack label
        self.caps: dict[int, int] = {} if caps is None else caps  # shape id -> how many fit (the placer's cache)
        self.base = 0
        self.score = 0
        self.rescore(weights)

    def rescore(self, w: Weights) -> None:
        self.base = self.cpu * w[0] + self.mem * w[1] + self.disk * w[2]  # capacity left: pack's best fit
        self.score = self.base + self.gpu * w[3]  # free resources: spread's "most free"


class SortedNames:
    """Distinct hostnames in sorted order, in chunks of a few hundred. One plain sorted list would cost a memmove of
    the whole list per insert or delete: ~7 us for a class of 10,000 identical hosts, paid on every host a gang
    takes and every upsert. Chunks keep that to a short list plus a bisect over the chunks' last names."""

    __slots__ = ("chunks", "lasts", "size")

    def __init__(self) -> None:
        self.chunks: list[list[str]] = []
        self.lasts: list[str] = []  # lasts[i] == chunks[i][-1]
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[str]:
        for chunk in self.chunks:
            yield from chunk

    def first(self) -> str:
        return self.chunks[0][0]

    def add(self, name: str) -> None:
        lasts = self.lasts
        i = bisect_left(lasts, name)
        if i == len(lasts):
            if not lasts:
                self.chunks.append([name])
                lasts.append(name)
                self.size = 1
                return
            i -= 1
            chunk = self.chunks[i]
            chunk.append(name)  # names mostly arrive in order (a rebuild, a constrained view): the cheap case
            lasts[i] = name
        else:
            chunk = self.chunks[i]
            insort(chunk, name)
        self.size += 1
        if len(chunk) > 2 * _CHUNK:
            self.chunks[i : i + 1] = [chunk[:_CHUNK], chunk[_CHUNK:]]
            lasts[i : i + 1] = [chunk[_CHUNK - 1], chunk[-1]]

    def remove(self, name: str) -> None:
        i = bisect_left(self.lasts, name)
        if i == len(self.lasts):
            raise KeyError(name)
        chunk = self.chunks[i]
        j = bisect_left(chunk, name)
        if chunk[j] != name:
            raise KeyError(name)
        del chunk[j]
        self.size -= 1
        if not chunk:
            del self.chunks[i]
            del self.lasts[i]
        elif j == len(chunk):
            self.lasts[i] = chunk[-1]


class ClassView:
    """The classes one gang may use: all of the index's, or (for a constrained gang) the same classes narrowed to the
    hosts its constraints allow. Hosts the gang has used leave the view (`take`) so that "a host this gang has not
    used yet" is simply any host still in a class; `settle` files them back in the index under their new state."""

    __slots__ = ("index", "hosts", "tiers", "order", "eligible", "own")

    def __init__(
        self,
        index: HostIndex,
        tiers: dict[bool, dict[ClassKey, HostClass]],
        order: dict[bool, _Order],
        eligible: int,
        own: bool,
    ) -> None:
        self.index = index
        self.hosts = index._hosts
        self.tiers = tiers  # has_gpus -> class key -> class
        self.order = order  # has_gpus -> the same classes, most free first (classes emptied by `take` may linger)
        self.eligible = eligible  # hosts the gang's constraints allow
        self.own = own  # classes of its own (a narrowed copy), not the index's

    def take(self, h: HostState) -> None:
        if self.own:
            tier = self.tiers[h.has_gpus]
            key = h.key()
            c = tier[key]
            c.names.remove(h.name)
            if h.rack:
                rl = c.racks[h.rack]
                rl.remove(h.name)
                if not rl:
                    del c.racks[h.rack]
            if not c.names:
                del tier[key]
        self.index._detach(h)

    def settle(self, hosts: Iterable[HostState]) -> None:
        for h in hosts:
            self.index._attach(h)


class HostIndex:
    """Free state of every host, grouped into classes of identical free vectors, plus a label index."""

    def __init__(self, offers: Iterable[HostOffer] = (), *, rack_label: str = "rack") -> None:
        self._rack_label = rack_label
        self._hosts: dict[str, HostState] = {}
        # has_gpus -> class key -> class. Never rebound: the unconstrained view shares these dicts.
        self._tiers: dict[bool, dict[ClassKey, HostClass]] = {False: {}, True: {}}
        self._labels: dict[str, dict[str, set[str]]] = {}
        self._eligible: dict[tuple[Constraint, ...], list[str]] = {}
        # Spread wants the most free class that fits: kept sorted as classes come and go, not sorted per gang.
        self._order: dict[bool, _Order] = {False: [], True: []}
        # How many hosts have each capacity value, per dimension (cpu, mem, disk, gpu): what makes cores, MiB and
        # GPUs comparable is a fraction of the largest capacity, and that must follow hosts coming and going.
        self._cap_counts: tuple[dict[int, int], ...] = ({}, {}, {}, {})
        self._weights: Weights = (0, 0, 0, 0)
        self._shapes: dict[Vec, int] = {}
        self._all = ClassView(self, self._tiers, self._order, 0, own=False)
        for o in offers:
            self.upsert(o)

    # --- the host manager's side ------------------------------------------------------------------------------

    def upsert(self, offer: HostOffer) -> None:
        """A new host, or the authoritative free state, labels and capacity of a known one."""
        free = to_vec(offer.free)
        # Capacity is at least what was ever offered free: callers that leave capacity empty still get a scale.
        given = to_vec(offer.capacity)
        cap = (
            max(given[0], free[0]),
            max(given[1], free[1]),
            max(given[2], free[2]),
            max(given[3], free[3]),
            max(given[4], free[4]),
        )
        has_gpus = offer.has_gpus or offer.free.gpu > 0 or offer.capacity.gpu > 0
        labels = dict(offer.labels)
        rack = labels.get(self._rack_label, "")
        h = self._hosts.get(offer.hostname)
        if h is None:
            h = HostState(offer.hostname, offer.address, labels, rack, cap, has_gpus, free)
            self._hosts[h.name] = h
            self._index_labels(h, +1)
            self._count_capacity(cap, +1)
            self._eligible.clear()
            self._attach(h)
            return
        if labels != h.labels:
            self._index_labels(h, -1)
            h.labels = labels
            self._index_labels(h, +1)
            self._eligible.clear()
        if cap != h.capacity:
            self._count_capacity(h.capacity, -1)
            self._count_capacity(cap, +1)
            h.capacity = cap
        h.address = offer.address
        if free != h.free() or has_gpus != h.has_gpus or rack != h.rack:
            self._detach(h)
            h.rack, h.has_gpus = rack, has_gpus
            h.cpu, h.mem, h.disk, h.gpu, h.ports = free
            self._attach(h)

    def remove(self, hostname: str) -> None:
        """Forget a host (gone from the cluster). Unknown names are ignored."""
        h = self._hosts.pop(hostname, None)
        if h is None:
            return
        self._detach(h)
        self._index_labels(h, -1)
        self._count_capacity(h.capacity, -1)
        self._eligible.clear()

    def release(self, placement: GangPlacement) -> None:
        """Give back what `placement` took from this index (its claim was refused later). Only for a placement whose
        hosts have not been upserted since: an upsert is the authoritative state and already accounts for it.
        Hosts removed meanwhile are skipped."""
        self.shift([(m.hostname, m.resources) for m in placement.members], 1)

    def hide(self, names: Iterable[str]) -> dict[str, Vec]:
        """Take away whatever is free on these hosts (kept for a waiting gang), so that the placer sees them full;
        `unhide` gives it back. Unknown hosts are skipped."""
        hidden: dict[str, Vec] = {}
        for name in names:
            h = self._hosts.get(name)
            if h is None or name in hidden:
                continue
            v = h.free()
            if any(v):
                self._add(h, v, -1)
                hidden[name] = v
        return hidden

    def unhide(self, hidden: dict[str, Vec]) -> None:
        self.add_free(hidden, 1)

    def add_free(self, amounts: dict[str, Vec], sign: int) -> None:
        """Add (1) or take away (-1) these amounts of free resources on these hosts (a what-if); unknown hosts are
        skipped."""
        for name, v in amounts.items():
            h = self._hosts.get(name)
            if h is not None:
                self._add(h, v, sign)

    def _add(self, h: HostState, v: Vec, sign: int) -> None:
        self._detach(h)
        h.cpu += sign * v[0]
        h.mem += sign * v[1]
        h.disk += sign * v[2]
        h.gpu += sign * v[3]
        h.ports += sign * v[4]
        self._attach(h)

    def states(self) -> Iterator[HostState]:
        """Every host (read only: change them through the index)."""
        return iter(self._hosts.values())

    def shift(self, usage: Iterable[tuple[str, Resources]], sign: int) -> None:
        """Add (sign 1) or take away (sign -1) resources on hosts: what a gang holds, given back in a what-if (victim
        choice frees a running gang's hosts, tries the placer, and takes them back). Unknown hosts are skipped."""
        back: dict[str, list[int]] = {}
        for hostname, r in usage:
            if hostname not in self._hosts:
                continue
            v = to_vec(r)
            acc = back.setdefault(hostname, [0, 0, 0, 0, 0])
            for d in range(5):
                acc[d] += sign * v[d]
        for name, add in back.items():
            self._add(self._hosts[name], (add[0], add[1], add[2], add[3], add[4]), 1)

    # --- reading ------------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._hosts)

    def __contains__(self, hostname: object) -> bool:
        return hostname in self._hosts

    def get(self, hostname: str) -> HostOffer | None:
        """The host with its current free resources (no GPU ids or ports: the index keeps counts only). Its capacity
        is at least the free state last upserted, and has_gpus is what the placer uses (also true when the offer
        only showed free or total GPUs)."""
        h = self._hosts.get(hostname)
        return None if h is None else self._offer(h)

    def offers(self) -> list[HostOffer]:
        """Every host with its current free state, by hostname (for tests and debugging)."""
        return [self._offer(self._hosts[n]) for n in sorted(self._hosts)]

    def class_count(self) -> int:
        """How many distinct free states the hosts fall into (what a placement decision scans)."""
        return len(self._tiers[False]) + len(self._tiers[True])

    # --- for the placer -----------------------------------------------------------------------------------------

    def classes(self) -> Iterator[HostClass]:
        """Every non-empty class (hosts taken out by a gang being tried are in none)."""
        yield from self._tiers[False].values()
        yield from self._tiers[True].values()

    def host(self, hostname: str) -> HostState:
        return self._hosts[hostname]

    def weights(self) -> Weights:
        """Integer weights proportional to 1 / the largest capacity in cpu, mem, disk and gpu (0 where there is
        none): a score `sum(free[d] * w[d])` adds up cores, MiB and GPUs as fractions of the biggest host, exactly,
        so equal scores are really equal and ties fall to the hostname."""
        return self._weights

    def shape_id(self, v: Vec) -> int:
        """A small number for a member size, the key of the per-class caches."""
        sid = self._shapes.get(v)
        if sid is None:
            if len(self._shapes) >= SHAPES_MAX:
                # sizes of gangs long gone (a daemon's months of them): forget them all, and the counts cached
                # under their ids (shared with the views' classes: cleared in place), rather than keep every size
                # ever placed in every class for the index's life. Ids are used only within one gang's placement.
                self._shapes.clear()
                for tier in self._tiers.values():
                    for c in tier.values():
                        c.caps.clear()
            sid = self._shapes[v] = len(self._shapes)
        return sid

    def view(self, constraints: tuple[Constraint, ...]) -> ClassView:
        """The classes a gang with these constraints may use. Unconstrained: the index's own classes (no copy)."""
        if not constraints:
            self._all.eligible = len(self._hosts)
            return self._all
        names = self.eligible(constraints)
        tiers: dict[bool, dict[ClassKey, HostClass]] = {False: {}, True: {}}
        hosts = self._hosts
        weights = self._weights
        for n in names:  # sorted, so every list below is built sorted
            h = hosts[n]
            c = h.cls
            assert c is not None
            tier = tiers[h.has_gpus]
            sub = tier.get(c.key)
            if sub is None:
                sub = tier[c.key] = HostClass(c.key, weights, c.caps)  # same vector, same cache
            sub.names.add(n)
            if h.rack:
                rl = sub.racks.get(h.rack)
                if rl is None:
                    rl = sub.racks[h.rack] = SortedNames()
                rl.add(n)
        order = {g: sorted((-c.score, c.key, c) for c in tier.values()) for g, tier in tiers.items()}
        return ClassView(self, tiers, order, len(names), own=True)

    def eligible(self, constraints: tuple[Constraint, ...]) -> list[str]:
        """Sorted names of the hosts where every constraint holds. Labels change rarely (free states change every
        round), so the answer is cached until a host comes, goes or changes labels."""
        cached = self._eligible.get(constraints)
        if cached is not None:
            return cached
        pool: set[str] | KeysView[str] | None = None
        for c in constraints:
            cand = self._candidates(c)
            if cand is not None and (pool is None or len(cand) < len(pool)):
                pool = cand
        if pool is None:
            pool = self._hosts.keys()
        hosts = self._hosts
        names = sorted(n for n in pool if all(c.matches(hosts[n].labels) for c in constraints))
        if len(self._eligible) >= _ELIGIBLE_CACHE_MAX:
            self._eligible.clear()
        self._eligible[constraints] = names
        return names

    def fails_somewhere(self, constraint: Constraint) -> bool:
        """Whether some host does not satisfy `constraint` (for failure explanations)."""
        cand = self._candidates(constraint)
        pool = self._hosts.keys() if cand is None else cand
        hosts = self._hosts
        matched = sum(1 for n in pool if constraint.matches(hosts[n].labels))
        return matched < len(hosts)

    def check(self) -> None:
        """Raise AssertionError if the internal structure disagrees with the hosts' states (tests and debugging)."""

        def need(ok: bool, what: str) -> None:
            if not ok:
                raise AssertionError(what)

        seen = 0
        for has_gpus, tier in self._tiers.items():
            for key, c in tier.items():
                need(c.key == key and c.has_gpus == has_gpus, f"class {key} filed under the wrong key")
                need(bool(c.names), f"empty class {key}")
                for names in (c.names, *c.racks.values()):
                    flat = list(names)
                    need(bool(flat) and flat == sorted(set(flat)), f"class {key}: names empty, unsorted or repeated")
                    need(len(names) == len(flat), f"class {key}: names miscounted")
                    need(names.lasts == [chunk[-1] for chunk in names.chunks], f"class {key}: chunk ends wrong")
                    need(all(0 < len(chunk) <= 2 * _CHUNK for chunk in names.chunks), f"class {key}: chunk size")
                racked = [n for rl in c.racks.values() for n in rl]
                for n in c.names:
                    h = self._hosts.get(n)
                    need(h is not None and h.cls is c and h.key() == key, f"host {n} misfiled in class {key}")
                    assert h is not None
                    need(not h.rack or n in list(c.racks.get(h.rack, ())), f"host {n} missing from its rack list")
                need(sorted(racked) == sorted(n for n in c.names if self._hosts[n].rack), f"class {key} rack lists")
                seen += len(c.names)
        need(seen == len(self._hosts), "a host is in no class")
        for has_gpus, tier in self._tiers.items():
            want = sorted((-c.score, c.key) for c in tier.values())
            need([(s, k) for s, k, _ in self._order[has_gpus]] == want, "spread order out of date")
            need(all(e[2] is tier[e[1]] for e in self._order[has_gpus]), "spread order holds a stale class")
            w = self._weights
            need(all(c.score == c.base + c.gpu * w[3] for c in tier.values()), "stale class score")
        labels: dict[str, dict[str, set[str]]] = {}
        for h in self._hosts.values():
            for k, v in h.labels.items():
                labels.setdefault(k, {}).setdefault(v, set()).add(h.name)
        need(labels == self._labels, "label index out of date")
        caps: list[dict[int, int]] = [{}, {}, {}, {}]
        for h in self._hosts.values():
            for d in range(4):
                caps[d][h.capacity[d]] = caps[d].get(h.capacity[d], 0) + 1
        need(tuple(caps) == self._cap_counts, "capacity counts out of date")

    # --- internals ----------------------------------------------------------------------------------------------

    def _offer(self, h: HostState) -> HostOffer:
        return HostOffer(
            hostname=h.name,
            address=h.address,
            free=_to_resources(h.free()),
            labels=dict(h.labels),
            capacity=_to_resources(h.capacity),
            has_gpus=h.has_gpus,
        )

    def _attach(self, h: HostState) -> None:
        key = (h.has_gpus, h.cpu, h.mem, h.disk, h.gpu, h.ports)
        tier = self._tiers[h.has_gpus]
        c = tier.get(key)
        if c is None:
            c = tier[key] = HostClass(key, self._weights)
            insort(self._order[h.has_gpus], (-c.score, key, c))
        c.names.add(h.name)
        if h.rack:
            rl = c.racks.get(h.rack)
            if rl is None:
                rl = c.racks[h.rack] = SortedNames()
            rl.add(h.name)
        h.cls = c

    def _detach(self, h: HostState) -> None:
        c = h.cls
        assert c is not None, f"host {h.name} is in no class"
        c.names.remove(h.name)
        if h.rack:
            rl = c.racks[h.rack]
            rl.remove(h.name)
            if not rl:
                del c.racks[h.rack]
        if not c.names:
            del self._tiers[c.has_gpus][c.key]
            order = self._order[c.has_gpus]
            i = bisect_left(order, (-c.score, c.key))
            if order[i][2] is not c:
                raise KeyError(c.key)
            del order[i]
        h.cls = None

    def _index_labels(self, h: HostState, sign: int) -> None:
        for k, v in h.labels.items():
            if sign > 0:
                self._labels.setdefault(k, {}).setdefault(v, set()).add(h.name)
                continue
            values = self._labels[k]
            names = values[v]
            names.discard(h.name)
            if not names:
                del values[v]
                if not values:
                    del self._labels[k]

    def _count_capacity(self, cap: Vec, sign: int) -> None:
        new_value = False
        for d in range(4):
            counts = self._cap_counts[d]
            n = counts.get(cap[d], 0) + sign
            if n:
                counts[cap[d]] = n
                new_value = new_value or n == 1 and sign > 0
            else:
                del counts[cap[d]]
                new_value = True
        if not new_value:
            return  # the same set of capacities, so the same largest ones
        tops = [max(counts) if counts else 0 for counts in self._cap_counts]
        whole = lcm(*(t for t in tops if t > 0))
        weights = (
            whole // tops[0] if tops[0] > 0 else 0,
            whole // tops[1] if tops[1] > 0 else 0,
            whole // tops[2] if tops[2] > 0 else 0,
            whole // tops[3] if tops[3] > 0 else 0,
        )
        if weights != self._weights:
            self._weights = weights
            for has_gpus, tier in self._tiers.items():
                for c in tier.values():
                    c.rescore(weights)
                self._order[has_gpus][:] = sorted((-c.score, c.key, c) for c in tier.values())

    def _candidates(self, c: Constraint) -> set[str] | None:
        """A superset of the hosts where `c` holds, from the label index; None when it cannot narrow (`ne`)."""
        values = self._labels.get(c.attribute, {})
        if c.op == "eq":
            return values.get(c.value, set())
        if c.op == "in":
            out: set[str] = set()
            for v in dict.fromkeys(x.strip() for x in c.value.split(",")):
                out |= values.get(v, set())
            return out
        if c.op == "exists":
            out = set()
            for names in values.values():
                out |= names
            return out
        if c.op == "ne":
            return None
        return set()  # an unknown operator matches nothing (Constraint.matches)
