"""Model-aware jobs at the job manager: the stored model a spec names, turned into the goal its gangs are placed
by; the gang size of `instances: auto`; and `peloton job plan` (the best plans on the cluster as it is now).

A thin shell over the pure search (peloton/modelaware/plan.py): it reads the stored model and asks the host
manager for the hosts' free state; the decisions are the search's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace

from sqlalchemy.orm import Session, sessionmaker

from peloton.api.clients import HostManagerClient, ResourceManagerClient
from peloton.domain import limits
from peloton.domain.resources import Resources
from peloton.domain.spec import JobSpec, validate, validate_submitted, with_workers, worker_roles
from peloton.errors import InvalidArgument, NotFound
from peloton.modelaware import autosize
from peloton.modelaware import plan as plans
from peloton.modelaware.document import parse_document
from peloton.modelaware.gpus import DEFAULT_TABLE, GpuTable
from peloton.placement.index import HostIndex
from peloton.placement.placer import worker_slots
from peloton.store import repo
from peloton.store.db import transaction


@dataclass(frozen=True, slots=True)
class PlanOutcome:
    plans: list[plans.Plan]  # best first
    on_free_hosts: bool  # planned on what is free now (False: nothing fits now; planned on whole hosts)


class Planner:
    def __init__(self, read_sessions: sessionmaker[Session], hostmgr: HostManagerClient, resmgr: ResourceManagerClient,
                 capacity: Callable[[], HostIndex | None], gpu_table: GpuTable = DEFAULT_TABLE) -> None:
        self.read_sessions = read_sessions
        self.gpu_table = gpu_table  # --gpu-table: the built-in one with the operator's rows
        self.hostmgr = hostmgr
        self.resmgr = resmgr
        self.capacity = capacity  # every host's full capacity (the job manager's cached index)

    def goal(self, spec: JobSpec) -> plans.PlanGoal:
        """The cost model and batch of the stored model `spec.model` names; InvalidArgument naming model.* when it
        is missing or cannot predict."""
        m = spec.model
        assert m is not None
        try:
            with transaction(self.read_sessions) as s:
                stored = repo.get_model(s, m.name)
        except NotFound:
            raise InvalidArgument(f"model.name: no stored model {m.name!r} (peloton model list; peloton model "
                                  "create NAME -f MODEL.json)", field="model.name") from None
        doc = parse_document(json.loads(stored.document))
        try:
            params = doc.cost_params(self.gpu_table)
        except InvalidArgument as e:
            raise InvalidArgument(f"model.name: the stored model {m.name!r} cannot predict: {e.message}",
                                  field="model.name") from None
        local, glob = m.local_bsz, m.global_bsz
        if not local and not glob:
            local, glob = doc.description.local_bsz, doc.description.global_bsz
        if not local and not glob:
            raise InvalidArgument(f"model.local_bsz: required (the stored model {m.name!r} gives no batch; or "
                                  "model.global_bsz)", field="model.local_bsz")
        return plans.PlanGoal(params, doc.description.sync, local, glob, m.objective,
                              plans.rows_of(self.gpu_table))

    def resolve(self, spec: JobSpec) -> JobSpec:
        """A model-aware spec with its goal recorded (and, with `instances: auto`, its workers counted); any other
        spec as it is. Validates the spec (with a stand-in count while the count is still to be chosen)."""
        m = spec.model
        if m is None:
            return spec
        validate_submitted(spec)
        goal = self.goal(spec)
        if m.auto_instances:
            count = self.auto_count(spec, goal)
            if count is None:
                hi = m.max_instances or "any"
                raise InvalidArgument(f"instances: auto: no plan of {m.min_instances} to {hi} workers fits this "
                                      "cluster, even empty", field="instances")
            spec = replace(with_workers(spec, count.gpus), min_available=0)
        spec = replace(spec, model=replace(m, goal_json=json.dumps(plans.goal_to_dict(goal))))
        return validate(spec)

    def plan(self, spec: JobSpec, goal: plans.PlanGoal | None = None, top: int = 5) -> PlanOutcome:
        """The best plans for `spec` on the hosts' free state now; when none fits now, on the whole hosts."""
        m = spec.model
        if m is None:
            raise InvalidArgument("model.name: required to plan a job (the stored model whose cost model rates the "
                                  "plans)", field="model.name")
        goal = goal or self.goal(spec)
        roles = spec.all_roles()
        workers = worker_roles(spec)
        if len(workers) != 1:
            validate(spec)  # says what is wrong with the roles
        worker = roles[workers[0]]
        servers = sum(r.instances for i, r in enumerate(roles) if i != workers[0])
        if not m.auto_instances:
            return self._search(spec, goal, servers, top, gpus=worker.instances)
        count = self.auto_count(spec, goal)  # the plans of the count `job create` would choose now
        return self._search(spec, goal, servers, top, gpus=count.gpus) if count else PlanOutcome([], False)

    def _search(self, spec: JobSpec, goal: plans.PlanGoal, servers: int, top: int, **counts: int) -> PlanOutcome:
        """The plan search on the hosts' free state now; when nothing fits now, on the whole hosts."""
        worker = spec.all_roles()[worker_roles(spec)[0]]
        for index, free_now in ((self._free_now(), True), (self.capacity(), False)):
            if index is None:
                continue
            slots = worker_slots(index, spec.constraints, worker.resources)
            found = plans.search(goal.params, slots, self._request(goal, servers, top, **counts), goal.table())
            if found:
                return PlanOutcome(found, free_now)
        return PlanOutcome([], False)

    def auto_count(self, spec: JobSpec, goal: plans.PlanGoal) -> autosize.CountChoice | None:
        """The worker count of an `instances: auto` spec: the plan search's best plan of each allowed count on the
        GPUs free now and on the whole cluster as if empty, and autosize's rule over them at model.min_efficiency
        (objective `throughput`); with objective `efficiency`, the count of the best samples/s per GPU (now, else as if
        empty). None when no allowed count can be placed even on the empty cluster."""
        m = spec.model
        assert m is not None and m.auto_instances
        roles = spec.all_roles()
        w = worker_roles(spec)[0]
        servers = sum(r.instances for i, r in enumerate(roles) if i != w)
        free = worker_slots(self._free_now(), spec.constraints, roles[w].resources)
        whole = self.capacity()
        empty = worker_slots(whole, spec.constraints, roles[w].resources) if whole is not None else free
        top = self._auto_top(spec) or sum(h.free_gpus for h in empty)
        if goal.objective != "throughput":  # the best samples/s per GPU of any allowed count
            out = self._search(spec, goal, servers, 1, min_gpus=m.min_instances, max_gpus=top)
            if not out.plans:
                return None
            return autosize.CountChoice(out.plans[0].gpus, out.plans[0].samples_per_s, 0.0, out.on_free_hosts,
                                        f"objective {goal.objective}: the best samples/s per GPU")

        # every count rated at once (plans.size_rates: the same rates as one search per count, the hosts' kinds
        # and classes made once); a count searched on the GPUs free now only where it can fit them, and not again
        # on an idle cluster (the free slots are every slot)
        req = self._request(goal, servers, 1)
        counts = range(m.min_instances, top + 1)
        best = plans.size_rates(goal.params, empty, counts, req, goal.table())
        now = best
        if free != empty:
            free_gpus = sum(h.free_gpus for h in free)
            fits = [k for k, b in zip(counts, best, strict=True) if b and k <= free_gpus]
            rated = dict(zip(fits, plans.size_rates(goal.params, free, fits, req, goal.table()), strict=True))
            now = [rated.get(k, 0.0) for k in counts]
        options = [autosize.CountOption(k, b, n) for k, b, n in zip(counts, best, now, strict=True)]
        threshold = autosize.DEFAULT_MIN_EFFICIENCY if m.min_efficiency is None else m.min_efficiency
        return autosize.choose_count(options, threshold)

    @staticmethod
    def _request(goal: plans.PlanGoal, servers: int, top: int, **kw: int) -> plans.PlanRequest:
        return plans.PlanRequest(local_bsz=goal.local_bsz, global_bsz=goal.global_bsz, objective=goal.objective,
                                 pattern=goal.pattern if goal.pattern != plans.PS or servers else plans.RING,
                                 servers=servers if goal.pattern == plans.PS else 0, top=top, **kw)

    def _auto_top(self, spec: JobSpec) -> int:
        """The most workers an `instances: auto` spec may get (autosize.upper_bound): model.max_instances, the GPUs
        its pool would be entitled to if it asked for them, the GPUs its pool reserves."""
        m = spec.model
        assert m is not None
        roles = spec.all_roles()
        w = worker_roles(spec)[0]
        top_count = m.max_instances
        extra = roles[w].resources.scale(top_count or limits.MAX_GANG_SIZE)
        for i, r in enumerate(roles):
            if i != w:
                extra = extra + r.resources.scale(r.instances)
        return autosize.upper_bound(top_count, m.min_instances, self._entitled_gpus(spec.respool, extra),
                                    self._reserved_gpus(spec.respool))

    def _reserved_gpus(self, pool: str) -> int:
        """The GPUs `pool` reserves (0: none, or no such pool)."""
        try:
            with transaction(self.read_sessions) as s:
                return int(repo.get_pool(s, pool).reservation.gpu)
        except NotFound:
            return 0

    def _entitled_gpus(self, pool: str, asking: Resources) -> int | None:
        """The whole GPUs `pool` would be entitled to if it also asked for `asking`; None while the resource
        manager does not know (no capacity yet, or the pool is not its)."""
        return self.resmgr.entitled_gpus(pool, asking)

    def free_now(self) -> HostIndex:
        """The hosts' free resources now (a dry run places a job's gangs on them)."""
        return self._free_now()

    def _free_now(self) -> HostIndex:
        return HostIndex(self.hostmgr.sync_hosts(0, timeout_s=10).offers)

