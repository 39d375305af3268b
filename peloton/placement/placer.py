"""The placement decision: gangs onto hosts, every member or none.

Pure: no I/O, no clock, no threads. Given the same gangs and the same host states it returns the same answer.

The hosts live in a `HostIndex` (peloton/placement/index.py) that the placement engine keeps across rounds; `place`
deducts what it decides from it, so the next round starts from there plus whatever the host manager upserted. The
decision works on counts: a member's GPUs and ports are numbers here, and the host manager picks the concrete ids
when it claims the placement.

A gang is tried member by member. A host the gang uses is taken out of its class for the rest of the try (so "a host
this gang has not used yet" is any host still in a class) and carries an undo record; when the gang is whole the
hosts are filed under their new free state, otherwise they are restored exactly. New hosts are chosen by comparing
classes of identical free state, not hosts, so one gang costs about O(classes + members), not O(hosts).

Quality rules (the tests hold them):
- pack: fewest hosts. Stay on the host being filled, then the other hosts the gang already uses, then the host that
  fits the most of the remaining members; among those, for GPU work the fewest GPUs left first (whole free GPU hosts
  stay whole), then a host in a rack the gang already uses (fewest racks), then the least capacity left (best fit),
  then hostname.
- spread: each member on the host with the fewest members of this gang so far, then the most free resources, then
  hostname.
- GPU hosts are kept for GPU work: members without GPUs use hosts without GPUs first and GPU hosts only when nothing
  else fits; GPU members only go to GPU hosts.
- constraints restrict the hosts of a gang.
- a gang of members of different sizes (a job's roles) is tried with its GPU members first, so members without GPUs
  take what the GPU hosts have left rather than the cores the GPU members need there.
"""

from __future__ import annotations

from collections.abc import Sequence

from peloton.domain.placement import (
    GangPlacement,
    GangRequest,
    HostOffer,
    MemberAssignment,
    MemberRequest,
    PlacementFailure,
)
from peloton.domain.resources import Resources, format_mib
from peloton.domain.spec import Constraint
from peloton.modelaware import plan as plans
from peloton.modelaware.plan import PlanChoice, PlanGoal
from peloton.placement.index import UNIT, ClassKey, ClassView, HostClass, HostIndex, HostState, Vec, Weights, to_vec

__all__ = ["place", "can_ever_fit", "worker_slots", "SHORT_DIMENSIONS", "HostIndex"]

SHORT_DIMENSIONS = ("cpu", "mem", "disk", "gpu", "ports", "constraint")

_UNBOUNDED = 1 << 62  # how many members of size zero fit anywhere
# Host tiers in order of preference (has_gpus): GPU members only on GPU hosts; others on GPU hosts last.
_GPU_LEVELS = (True,)
_CPU_LEVELS = (False, True)


def _fits(h: HostState | HostClass, r: Vec) -> bool:
    return r[0] <= h.cpu and r[1] <= h.mem and r[2] <= h.disk and r[3] <= h.gpu and r[4] <= h.ports


def _short_of(h: HostState | HostClass, r: Vec) -> list[str]:
    out = []
    if r[0] > h.cpu:
        out.append("cpu")
    if r[1] > h.mem:
        out.append("mem")
    if r[2] > h.disk:
        out.append("disk")
    if r[3] > h.gpu:
        out.append("gpu")
    if r[4] > h.ports:
        out.append("ports")
    return out


def _short_of_vec(f: Vec, r: Vec) -> bool:
    return r[0] > f[0] or r[1] > f[1] or r[2] > f[2] or r[3] > f[3] or r[4] > f[4]


def _cap_vec(f: Vec, r: Vec) -> int:
    """How many members of size `r` fit in the free vector `f` (which fits at least one)."""
    return min((f[i] // r[i] for i in range(5) if r[i] > 0), default=_UNBOUNDED)


def _cap(c: HostClass, r: Vec) -> int:
    """How many members of size `r` fit on a host of class `c`."""
    if not _fits(c, r):
        return 0
    k = _UNBOUNDED
    if r[0] > 0:
        k = min(k, c.cpu // r[0])
    if r[1] > 0:
        k = min(k, c.mem // r[1])
    if r[2] > 0:
        k = min(k, c.disk // r[2])
    if r[3] > 0:
        k = min(k, c.gpu // r[3])
    if r[4] > 0:
        k = min(k, c.ports // r[4])
    return k


def _score(h: HostState, w: Weights) -> int:
    """Free resources as one number (spread prefers the emptiest host); HostClass.score for a single host."""
    return h.cpu * w[0] + h.mem * w[1] + h.disk * w[2] + h.gpu * w[3]


def _rack_pick(c: HostClass, racks: list[str]) -> tuple[int, str]:
    """(0, the lowest hostname of `c` in one of `racks`), else (1, the lowest hostname of `c`)."""
    name: str | None = None
    for rack in racks:
        rl = c.racks.get(rack)
        if rl is not None and (name is None or rl.first() < name):
            name = rl.first()
    return (1, c.names.first()) if name is None else (0, name)


def _how_many(c: HostClass, reqs: list[Vec], start: int) -> tuple[int, int, int, int, int]:
    """How many of reqs[start:] fit on a host of class `c` one after the other, and what it has left after them."""
    cpu, mem, disk, gpu, ports = c.cpu, c.mem, c.disk, c.gpu, c.ports
    k = 0
    for j in range(start, len(reqs)):
        r = reqs[j]
        if not (r[0] <= cpu and r[1] <= mem and r[2] <= disk and r[3] <= gpu and r[4] <= ports):
            break
        cpu -= r[0]
        mem -= r[1]
        disk -= r[2]
        gpu -= r[3]
        ports -= r[4]
        k += 1
    return k, cpu, mem, disk, gpu


class _Attempt:
    """One gang being tried: the hosts it took (with their state before), members per host, racks in use."""

    __slots__ = ("view", "used", "before", "count", "racks", "pairs")

    def __init__(self, view: ClassView) -> None:
        self.view = view
        self.used: list[HostState] = []  # in order of first use
        self.before: list[Vec] = []  # free state of used[i] before this gang
        self.count: dict[str, int] = {}  # hostname -> members of this gang on it
        self.racks: list[str] = []  # racks in order of first use
        self.pairs: list[tuple[MemberRequest, HostState]] = []

    def assign(self, h: HostState, r: Vec, member: MemberRequest) -> None:
        n = self.count.get(h.name)
        if n is None:
            self.view.take(h)
            self.used.append(h)
            self.before.append(h.free())
            n = 0
            if h.rack and h.rack not in self.racks:
                self.racks.append(h.rack)
        self.count[h.name] = n + 1
        h.cpu -= r[0]
        h.mem -= r[1]
        h.disk -= r[2]
        h.gpu -= r[3]
        h.ports -= r[4]
        self.pairs.append((member, h))

    def commit(self) -> None:
        self.view.settle(self.used)

    def rollback(self) -> None:
        for h, v in zip(self.used, self.before, strict=True):
            h.cpu, h.mem, h.disk, h.gpu, h.ports = v
        self.view.settle(self.used)


def _pack_new_host(
    tier: dict[ClassKey, HostClass], reqs: list[Vec], i: int, sid: int, homogeneous: bool, racks: list[str], w: Weights
) -> str | None:
    """The best host of `tier` for members i.. of a pack gang, compared class by class: most of the remaining members,
    then (GPU work) fewest GPUs left, then in a rack the gang uses, then least capacity left, then hostname."""
    r = reqs[i]
    remaining = len(reqs) - i
    rg = r[3]
    best: tuple[int, int, int, int, str] | None = None  # (-members, GPUs left, not in a used rack, left, hostname)
    if homogeneous:
        # For equal member counts "capacity left" orders like the class's own free capacity (`base`): it is that
        # minus the same k x the member size everywhere. Cheap rejections first: this loop is the hot path.
        best_k = 0
        best_gl = 0
        best_base = 0
        for c in tier.values():
            cap = c.caps.get(sid)
            if cap is None:
                cap = c.caps[sid] = _cap(c, r)
            if cap < best_k or not cap:
                continue
            k = cap if cap < remaining else remaining
            if k < best_k:
                continue
            gl = c.gpu - k * rg if rg else 0
            if k == best_k and (gl > best_gl or (gl == best_gl and not racks and c.base > best_base)):
                continue
            rank, name = _rack_pick(c, racks) if racks else (1, c.names.first())
            key = (-k, gl, rank, c.base, name)
            if best is None or key < best:
                best, best_k, best_gl, best_base = key, k, gl, c.base
    else:
        for c in tier.values():
            k, cpu, mem, disk, gpu = _how_many(c, reqs, i)
            if not k:
                continue
            rank, name = _rack_pick(c, racks) if racks else (1, c.names.first())
            key = (-k, gpu if rg else 0, rank, cpu * w[0] + mem * w[1] + disk * w[2], name)
            if best is None or key < best:
                best = key
    return None if best is None else best[4]


def _pack(
    att: _Attempt, view: ClassView, reqs: list[Vec], members: Sequence[MemberRequest], homogeneous: bool, w: Weights
) -> int | None:
    """Fill as few hosts (and racks) as possible; None when every member was placed, else the first unplaceable
    index."""
    current: HostState | None = None
    exhausted: set[bool] = set()
    sid = view.index.shape_id(reqs[0]) if homogeneous else -1
    for i, r in enumerate(reqs):
        chosen: HostState | None = None
        for level in _GPU_LEVELS if r[3] > 0 else _CPU_LEVELS:
            if level in exhausted:
                continue
            if current is not None and current.has_gpus == level and _fits(current, r):
                chosen = current
                break
            for h in att.used:
                if h.has_gpus == level and _fits(h, r):
                    chosen = h
                    break
            if chosen is not None:
                break
            name = _pack_new_host(view.tiers[level], reqs, i, sid, homogeneous, att.racks, w)
            if name is not None:
                chosen = view.hosts[name]
                break
            if homogeneous:
                exhausted.add(level)  # hosts only shrink while a gang is tried: no later member fits this tier
        if chosen is None:
            return i
        current = chosen
        att.assign(chosen, r, members[i])
    return None


def _model_aware(att: _Attempt, view: ClassView, reqs: list[Vec], members: Sequence[MemberRequest],
                 homogeneous: bool, w: Weights, goal: PlanGoal) -> tuple[int | None, PlanChoice | None]:
    """The gang's one-GPU workers where the cost model rates the plan best among the hosts free now (still whole);
    its CPU-only members (parameter servers, a chief) on the hosts the plan names for servers when they fit, else
    packed. A gang whose GPU members differ in size, or have more than one GPU each, is packed (the cost model
    counts one worker per GPU)."""
    workers = [i for i, r in enumerate(reqs) if r[3] > 0]
    if not workers or any(reqs[i] != reqs[workers[0]] for i in workers) or reqs[workers[0]][3] != 1:
        return _pack(att, view, reqs, members, homogeneous, w), None
    free = _slots(view, reqs[workers[0]])
    others = [i for i, r in enumerate(reqs) if r[3] == 0]
    chosen = plans.choose(goal, free, len(workers), servers=len(others))
    if chosen is None:
        return workers[0], None
    best, record = chosen
    it = iter(workers)
    for name, g in best.hosts:
        h = view.hosts[name]
        for _ in range(g):
            i = next(it)
            att.assign(h, reqs[i], members[i])
    rest = []
    for j, i in enumerate(others):
        target = view.hosts.get(best.servers[j]) if j < len(best.servers) else None
        if target is not None and _fits(target, reqs[i]) and (target.cls is not None or target.name in att.count):
            att.assign(target, reqs[i], members[i])
        else:
            rest.append(i)
    if rest:
        failed = _pack(att, view, [reqs[i] for i in rest], [members[i] for i in rest], False, w)
        if failed is not None:
            return rest[failed], None
    return None, record


def _slots(view: ClassView, worker: Vec) -> list[plans.FreeHost]:
    """Every GPU host of the view as the plan search sees it: how many workers of size `worker` it can take now.
    In the view's class order (most free first, then the class key; hostnames sorted within a class), not the
    tiers' insertion order: that order is the history of the index (hosts hidden and given back in set order),
    and the search keeps the first of equally rated plans, so it would decide where a gang goes."""
    free = []
    for _, _, c in view.order[True]:
        n = _cap(c, worker)
        if n > 0:
            for name in c.names:
                free.append(plans.free_host(name, n, view.hosts[name].labels))
    return free


def worker_slots(index: HostIndex, constraints: tuple[Constraint, ...], worker: Resources) -> list[plans.FreeHost]:
    """The hosts `constraints` allow, with the workers of size `worker` each can take (its free state in `index`):
    what `peloton job plan` and `instances: auto` plan on."""
    return _slots(index.view(constraints), to_vec(worker))


def _spread(
    att: _Attempt, view: ClassView, reqs: list[Vec], members: Sequence[MemberRequest], homogeneous: bool, w: Weights
) -> int | None:
    """Each member on the host with the fewest members of this gang so far, then the most free resources, then
    hostname. None when every member was placed, else the first unplaceable index."""
    ordered: dict[bool, list[tuple[int, ClassKey, HostClass]]] = {}
    cursor: dict[bool, int] = {}
    for i, r in enumerate(reqs):
        chosen: HostState | None = None
        for level in _GPU_LEVELS if r[3] > 0 else _CPU_LEVELS:
            classes = ordered.get(level)
            if classes is None:
                # A copy: taking hosts may drop emptied classes from the view's order while the cursor walks it.
                # Classes only lose hosts while a gang is tried, so the order stays valid for the whole gang.
                classes = ordered[level] = list(view.order[level])
            j = cursor.get(level, 0) if homogeneous else 0
            n = len(classes)
            while j < n:
                c = classes[j][2]
                if c.names and _fits(c, r):
                    break
                j += 1
            if homogeneous:
                # Classes before the cursor are empty or too small for this size, and stay so during this gang.
                cursor[level] = j
            if j < n:
                s, _, c = classes[j]
                name = c.names.first()
                j += 1
                while j < n and classes[j][0] == s:  # equal scores: the lowest hostname, whichever class
                    c = classes[j][2]
                    if c.names and c.names.first() < name and _fits(c, r):
                        name = c.names.first()
                    j += 1
                chosen = view.hosts[name]
                break
            best: tuple[int, int, str] | None = None
            for h in att.used:
                if h.has_gpus == level and _fits(h, r):
                    key = (att.count[h.name], -_score(h, w), h.name)
                    if best is None or key < best:
                        best, chosen = key, h
            if chosen is not None:
                break
        if chosen is None:
            return i
        att.assign(chosen, r, members[i])
    return None


_DIMS = ("cpu", "mem", "disk", "gpu", "ports")


def _amounts(v: Vec) -> str:
    """The non-zero parts of a vector as a reader writes them: `cpu 4, mem 8Gi, gpu 1`."""
    parts = []
    for d, x in zip(_DIMS, v, strict=True):
        if x:
            parts.append(f"{d} {format_mib(x / UNIT) if d in ('mem', 'disk') else f'{x / UNIT:g}' if d == 'cpu' else x}")
    return ", ".join(parts) or "nothing"


def _shortfall(f: Vec, r: Vec) -> Vec:
    """How much a host with `f` free lacks for a member needing `r`, per dimension (0 where it has enough)."""
    return (max(0, r[0] - f[0]), max(0, r[1] - f[1]), max(0, r[2] - f[2]), max(0, r[3] - f[3]), max(0, r[4] - f[4]))


def _closeness(short: Vec, r: Vec) -> tuple[int, float]:
    """Fewest dimensions short, then the least short relative to the need: the host nearest to fitting."""
    return sum(1 for x in short if x), sum(x / need for x, need in zip(short, r, strict=True) if x)


def _n_hosts(n: int) -> str:
    return f"{n} host" if n == 1 else f"{n} hosts"


def _explain(gang: GangRequest, members: Sequence[MemberRequest], failed_at: int, index: HostIndex, view: ClassView,
             att: _Attempt) -> PlacementFailure:
    """Why the gang failed at member `failed_at`, as plain data (short_hosts: per dimension, how many hosts lack it
    for that member as they stood then) and words: how many of the hosts the gang may use have the member's
    resources free, and by how much the nearest of the others falls short. For a gang of equal members the hosts
    are judged as they were before it (and how many of its members they have room for is said); for mixed
    members, as they stood when the member failed. `members`: in the order they were tried."""
    member = members[failed_at].resources
    r = to_vec(member)
    counts: dict[str, int] = {}
    for c in index.classes():
        for d in _short_of(c, r):
            counts[d] = counts.get(d, 0) + len(c.names)
    for h in att.used:
        for d in _short_of(h, r):
            counts[d] = counts.get(d, 0) + 1
    failed_constraints: list[Constraint] = []
    ineligible = len(index) - view.eligible
    if ineligible:
        counts["constraint"] = ineligible
        for con in dict.fromkeys(gang.constraints):
            if index.fails_somewhere(con):
                failed_constraints.append(con)
    short = {d: counts[d] for d in SHORT_DIMENSIONS if d in counts}
    n = len(members)
    homogeneous = all(m.resources == member for m in members)
    if homogeneous:
        need = f"gang of {n} needs {member.describe()} each"
    else:
        need = f"gang of {n}: instance {members[failed_at].instance} needs {member.describe()}"
    # the hosts the gang may use, each (free vector, how many hosts have it, the lowest name among them)
    states: list[tuple[Vec, int, str]] = [((c.cpu, c.mem, c.disk, c.gpu, c.ports), len(c.names), c.names.first())
                                          for tier in view.tiers.values() for c in tier.values() if c.names]
    states += [(before if homogeneous else h.free(), 1, h.name) for h, before in zip(att.used, att.before, strict=True)]
    fit = room = 0
    best: tuple[tuple[int, float], str, Vec] | None = None
    for f, k, name in states:
        if not _short_of_vec(f, r):
            fit += k
            room += k * _cap_vec(f, r)
            continue
        lack = _shortfall(f, r)
        key = (_closeness(lack, r), name, lack)
        if best is None or key[:2] < best[:2]:
            best = key
    ruled_out = ", ".join(x.describe() for x in failed_constraints)
    if not len(index):
        why = "no hosts offered"
    elif not view.eligible:
        why = f"none of the {_n_hosts(len(index))} satisfies {ruled_out}"
    else:
        why = f"{fit} of {view.eligible} hosts {'has' if fit == 1 else 'have'} {_amounts(r)} free"
        if not homogeneous and att.used:
            why += " with the members before it placed"
        elif fit and room < n:
            why += f", room for {room} of the {n} members"
        if best is not None:
            why += f"; the best{' other' if fit else ''}, {best[1]}, is short of {_amounts(best[2])}"
        if ineligible:
            why += f"; {_n_hosts(ineligible)} ruled out by {ruled_out}"
    return PlacementFailure(
        gang_id=gang.gang_id,
        job_id=gang.job_id,
        attempt=gang.attempt,
        reason=f"{need}; placed {len(att.pairs)} of {n}; {why}",
        short_hosts=short,
    )


def _try(gang: GangRequest, index: HostIndex, keep: bool) -> GangPlacement | PlacementFailure | None:
    """Place one gang. Kept: its resources stay deducted and the placement is returned. Not kept (a probe): the
    index is restored and None stands for success. A failure always leaves the index as it was."""
    members = gang.members
    if not members:
        return GangPlacement(gang.gang_id, gang.job_id, gang.attempt, ()) if keep else None
    first = members[0].resources
    homogeneous = all(m.resources is first or m.resources == first for m in members)
    position: dict[int, int] = {}  # id of a member -> its place in the gang (mixed members are tried reordered)
    if homogeneous:
        reqs = [to_vec(first)] * len(members)
    else:
        position = {id(m): j for j, m in enumerate(members)}
        # Members with GPUs first (the most first; otherwise in the gang's order): those without may then use what
        # GPU hosts have left, rather than take the cores the GPU members need there (a job's parameter servers
        # before its workers on a cluster of GPU hosts only).
        members = tuple(sorted(members, key=lambda m: -m.resources.gpu))
        reqs = [to_vec(m.resources) for m in members]
    view = index.view(gang.constraints)
    att = _Attempt(view)
    w = index.weights()
    plan: PlanChoice | None = None
    if gang.strategy == "spread":
        failed_at = _spread(att, view, reqs, members, homogeneous, w)
    elif gang.goal is not None:
        failed_at, plan = _model_aware(att, view, reqs, members, homogeneous, w, gang.goal)
    else:
        failed_at = _pack(att, view, reqs, members, homogeneous, w)
    if failed_at is not None:
        failure = _explain(gang, members, failed_at, index, view, att)
        att.rollback()
        return failure
    if not keep:
        att.rollback()
        return None
    att.commit()
    pairs = att.pairs if homogeneous else sorted(att.pairs, key=lambda p: position[id(p[0])])  # the gang's order
    return GangPlacement(
        gang_id=gang.gang_id,
        job_id=gang.job_id,
        attempt=gang.attempt,
        members=tuple(
            MemberAssignment(
                instance=m.instance, task_id=m.task_id, hostname=h.name, address=h.address, resources=m.resources
            )
            for m, h in pairs
        ),
        plan=plan,
    )


def place(
    gangs: Sequence[GangRequest], hosts: HostIndex | Sequence[HostOffer]
) -> tuple[list[GangPlacement], list[PlacementFailure]]:
    """Place each gang whole or not at all, in the given order. A placed gang's resources are deducted from `hosts`
    (an index is updated in place; a list of offers is copied into a fresh index first, so the caller's list is
    untouched); a gang that fails leaves the hosts exactly as they were."""
    index = hosts if isinstance(hosts, HostIndex) else HostIndex(hosts)
    placements: list[GangPlacement] = []
    failures: list[PlacementFailure] = []
    for gang in gangs:
        out = _try(gang, index, keep=True)
        if isinstance(out, GangPlacement):
            placements.append(out)
        elif out is not None:
            failures.append(out)
    return placements, failures


def can_ever_fit(gang: GangRequest, capacities: HostIndex | Sequence[HostOffer]) -> PlacementFailure | None:
    """Whether `gang` fits the hosts as given (used with full capacities: could it ever run here?). None if so, else
    why not. The index is left exactly as it was."""
    index = capacities if isinstance(capacities, HostIndex) else HostIndex(capacities)
    out = _try(gang, index, keep=False)
    return out if isinstance(out, PlacementFailure) else None
