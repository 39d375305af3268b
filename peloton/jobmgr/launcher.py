"""The launcher: placements in, running gangs out. Several launcher loops run this at once (a pool), each on its
own batch of placements, so gangs of different jobs are launched concurrently.

One pass: take claimed placements from resmgr (long poll) -> record the write-ahead intent of the whole batch in
one commit (gang LAUNCHING, every member's host, ports, GPUs) -> tell resmgr which intents are durable (only now
may it forget them: with the next poll of any launcher loop, which follows at once, a round trip fewer per pass
between processes; if the commit failed, they go back to its queue at once and their claims are released) ->
build each member's environment and ask the host manager to start the batch, each gang whole -> apply what could
not start: a launch the system refused goes back to the queue without costing an attempt, a member that would not
start fails the attempt.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from prometheus_client import Counter, Histogram

from peloton.api.clients import HostManagerClient, ResourceManagerClient
from peloton.domain import task_identity
from peloton.domain.launch import GangLaunch, LaunchOutcome, LaunchResult, LaunchSpec
from peloton.domain.model import split_gang_id
from peloton.domain.placement import GangPlacement, PlacementFailure
from peloton.domain.spec import JobSpec
from peloton.errors import PelotonError, Unreachable
from peloton.jobmgr import gang_policy as policy
from peloton.jobmgr.training_env import hostfile, hostfile_members, training_env, with_env_files
from peloton.jobmgr.writer import Kind, Mutation, Views, Writers
from peloton.observability.gang_metrics import STAGE
from peloton.retry import Backoff
from peloton.retry.sleeping import retry_call

log = logging.getLogger(__name__)

GANG_LAUNCHES = Counter("peloton_jobmgr_gang_launches_total", "Gang launch attempts", ["result"])
_GANG_LAUNCHES = {o: GANG_LAUNCHES.labels(o.value.lower()) for o in LaunchOutcome}  # looked up once, not a gang
LAUNCH_PASS = Histogram("peloton_jobmgr_launch_seconds", "From placements received to the launch answered",
                        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10))
BATCH = 64  # placements per pass


UNREACHABLE_RETRY_S = 3.0  # how long a launch that finds no host manager is tried again
# between its tries: the channel reconnects within a second of the peer's return (server.RECONNECT)
UNREACHABLE_BACKOFF = Backoff(0.1, 0.5)
RECORDED_CHECK_S = 2.0  # after a failed intent commit, how long the launcher asks which intents went in anyway


def _key(p: GangPlacement) -> tuple[str, int]:
    return p.gang_id, p.attempt


class Launcher:
    def __init__(self, writer: Writers, resmgr: ResourceManagerClient, hostmgr: HostManagerClient,
                 on_resmgr: Callable[[str], None] = lambda incarnation: None) -> None:
        """`on_resmgr(incarnation)`: told resmgr's incarnation on every answer (a new one: it forgot every gang)."""
        self.writer = writer
        self.resmgr = resmgr
        self.hostmgr = hostmgr
        self._on_resmgr = on_resmgr
        self.id = uuid.uuid4().hex  # resmgr hands again what a job manager of another id took and did not ack
        # placements whose intents are durable, acknowledged with the next GetPlacements of any loop (until then
        # resmgr keeps them handed out: a job manager that dies first has them handed again to the next, whose
        # recovery and intent check take them for what they are)
        self._acks_mu = threading.Lock()
        self._acks: list[tuple[str, int]] = []
        # gang attempts from before their launch intent is committed until the host manager's launch call returned
        # (-> how many passes have each): the backend may not know their members yet, and a reconciliation that
        # asked about them would be told "unknown" (LOST) and fail a gang that is about to start (`launching`)
        self._in_flight_mu = threading.Lock()
        self._in_flight: dict[tuple[str, int], int] = {}

    def launch_once(self, timeout_ms: int = 1000) -> bool:
        with self._acks_mu:
            acks, self._acks = self._acks, []
        try:
            resp = self.resmgr.get_placements(BATCH, timeout_ms / 1000, self.id, acks)
        except Exception:
            with self._acks_mu:  # not known to have arrived: sent again with the next poll (an ack repeats safely)
                self._acks[:0] = acks
            raise
        self._on_resmgr(resp.incarnation)
        if resp.pending:
            self._record_pending(resp.pending)
        if resp.preempt:
            self._preempt(resp.preempt)
        placements = resp.placements
        if not placements:
            return bool(resp.pending) or bool(resp.preempt)
        with LAUNCH_PASS.time():
            self._launch(placements)
        return True

    def _record_pending(self, pending: Sequence[PlacementFailure]) -> None:
        def apply(views: Views, now: float) -> policy.Effects:
            eff = policy.Effects()
            for f in pending:
                jv = views.get(f.job_id)
                if jv is not None:
                    _, idx = split_gang_id(f.gang_id)
                    eff.merge(policy.set_pending_reason(jv, idx, f.attempt, f.reason, now))
            return eff

        self.writer.submit(Mutation(Kind.APPLY, {f.job_id for f in pending}, apply=apply))  # nobody waits

    def _preempt(self, victims: Sequence[tuple[str, int, str]]) -> None:
        """Preempt each (gang id, attempt) whole, as resmgr decided; one still running as that attempt only. A
        lost order is given again: resmgr asks anew when the waiting gang still waits."""
        by_job: dict[str, list[tuple[int, int, str]]] = {}
        for gid, attempt, reason in victims:
            job_id, idx = split_gang_id(gid)
            by_job.setdefault(job_id, []).append((idx, attempt, reason))

        def apply(views: Views, now: float) -> policy.Effects:
            eff = policy.Effects()
            for job_id, gangs in by_job.items():
                jv = views.get(job_id)
                if jv is None:
                    continue
                for idx, attempt, reason in gangs:
                    gv = jv.gangs.get(idx)
                    if gv is not None:
                        eff.merge(policy.preempt_gang(jv, gv, attempt, now, reason))
            return eff

        self.writer.submit(Mutation(Kind.APPLY, set(by_job), apply=apply))

    def launching(self) -> set[tuple[str, int]]:
        """The gang attempts (gang id, attempt) whose launch is under way: their members are not to be asked
        about. A reconciliation reads this after it read the members' states: a gang it found LAUNCHING is in here
        until the backend knows its members."""
        with self._in_flight_mu:
            return set(self._in_flight)

    def _launch(self, placements: list[GangPlacement]) -> None:
        keys = [_key(p) for p in placements]
        with self._in_flight_mu:
            for k in keys:
                self._in_flight[k] = self._in_flight.get(k, 0) + 1
        try:
            self._launch_marked(placements)
        finally:
            with self._in_flight_mu:
                for k in keys:
                    if self._in_flight[k] > 1:
                        self._in_flight[k] -= 1
                    else:
                        del self._in_flight[k]

    def _launch_marked(self, placements: list[GangPlacement]) -> None:
        # `intent` runs once per shard of jobs, and again when a writer's batch failed: then for the same jobs,
        # which it decides afresh (a stop committed in between makes a placement stale)
        accepted: dict[tuple[str, int], tuple[GangPlacement, JobSpec]] = {}

        def intent(views: Views, now: float) -> policy.Effects:
            eff = policy.Effects()
            for p in placements:
                jv = views.get(p.job_id)
                if jv is None:
                    continue
                accepted.pop((p.gang_id, p.attempt), None)
                e = policy.launch_intent(jv, p, now)
                if e is not None:
                    eff.merge(e)
                    accepted[(p.gang_id, p.attempt)] = (p, jv.spec)
            return eff

        failure: Exception | None = None
        try:
            self.writer.mutate({p.job_id for p in placements}, intent)
        except Exception as e:
            # With several writer shards the intents commit shard by shard: a failed call may have recorded some
            # (those gangs are LAUNCHING in the store and must be launched, or they wait for their launch deadline
            # and lose an attempt). What was not recorded goes back to resmgr's queue, its claim released.
            recorded = self._recorded(accepted)
            for k in [k for k in accepted if k not in recorded]:
                del accepted[k]
            self._retry([p for p in placements if _key(p) not in accepted])
            if not accepted:
                raise
            failure = e
            placements = [p for p in placements if _key(p) in accepted]
        stale = [p for p in placements if (p.gang_id, p.attempt) not in accepted]
        with self._acks_mu:
            self._acks += [_key(p) for p in placements]
        if stale:
            self._release(stale)
        if not accepted:
            return
        gangs = [self._gang_launch(p, spec) for p, spec in accepted.values()]
        accepted_placements = [p for p, _ in accepted.values()]
        durable = time.monotonic()  # the launch intents are committed
        try:
            results = self._send_launch(gangs)
        except PelotonError as e:
            if isinstance(e, Unreachable):
                # never sent, so no member was started (a host manager that stays away): the gangs go back to
                # their queue as the same attempts, as after a refusal, and their claims are let go
                log.warning("launching %d gangs: the host manager could not be reached (%s): queued again as the "
                            "same attempts", len(gangs), e.message)
                GANG_LAUNCHES.labels("refused").inc(len(gangs))
                self._apply_results([LaunchResult(g.gang_id, g.attempt, LaunchOutcome.REFUSED, "",
                                                  "the host manager could not be reached") for g in gangs])
                self._release(accepted_placements)
                return
            # the outcome is unknown (the host manager may have started some): the gangs stay LAUNCHING; the
            # reconciler asks the backend about their members and the launch deadline ends them if need be
            log.error("launching %d gangs: %s", len(gangs), e.message)
            GANG_LAUNCHES.labels("unknown").inc(len(gangs))
            return
        launched = time.monotonic() - durable
        for res in results:
            _GANG_LAUNCHES[res.outcome].inc()
            if res.outcome == LaunchOutcome.OK:
                STAGE["launched"].observe(launched)
        bad = [res for res in results if res.outcome != LaunchOutcome.OK]
        if bad:
            self._apply_results(bad)
        if failure is not None:
            raise failure  # (the loop logs what could not be recorded)

    def _recorded(self, accepted: dict[tuple[str, int], tuple[GangPlacement, JobSpec]]) -> set[tuple[str, int]]:
        """Of the placements whose intent a failed call tried to record, those the store has (asked job by job, so
        that one shard still failing does not hide another's answer; unknown counts as not recorded). Asked for
        RECORDED_CHECK_S at most: a store that does not answer must not hold the launcher up job after job."""
        found: set[tuple[str, int]] = set()
        deadline = time.monotonic() + RECORDED_CHECK_S
        for job_id in {p.job_id for p, _ in accepted.values()}:
            if time.monotonic() > deadline:
                break
            mine = [p for p, _ in accepted.values() if p.job_id == job_id]

            def probe(views: Views, job_id: str = job_id, mine: list[GangPlacement] = mine) -> None:
                jv = views.get(job_id)
                if jv is not None:
                    found.update(_key(p) for p in mine if policy.intent_recorded(jv, p))

            try:
                self.writer.read_each(probe, [job_id])  # (a read: the job loaded from the store if it was dropped)
            except Exception:  # noqa: BLE001 - not known to be recorded: treated as not recorded, as before
                continue
        return found

    def _send_launch(self, gangs: Sequence[GangLaunch]) -> list[LaunchResult]:
        """LaunchGangs; a call that found no connection is tried again for a few seconds (a host manager that has
        just failed over or restarted: the channel reconnects within a second), as it started nothing."""
        return retry_call(lambda: self.hostmgr.launch(gangs), retry_if=lambda e: isinstance(e, Unreachable),
                          backoff=UNREACHABLE_BACKOFF, budget_s=UNREACHABLE_RETRY_S)

    def _release(self, placements: Sequence[GangPlacement]) -> None:
        try:
            self.hostmgr.release_claims([_key(p) for p in placements])
        except PelotonError as e:  # claims expire on their own
            log.warning("releasing claims: %s", e.message)

    def _retry(self, placements: Sequence[GangPlacement]) -> None:
        """Back to resmgr's queue at once (AckPlacements' retry), their claims released."""
        try:
            self.resmgr.ack_placements([], [_key(p) for p in placements])
        except PelotonError as e:  # resmgr times them out back to its queue; the intent check rejects repeats
            log.warning("acknowledging placements: %s", e.message)
        self._release(placements)

    @staticmethod
    def _gang_launch(p: GangPlacement, spec: JobSpec) -> GangLaunch:
        envs = training_env(p.job_id, p.attempt, p.members, spec.roles)
        files = {"hostfile": hostfile(hostfile_members(p.members, spec.roles))}
        user = spec.run_as if spec.run_as is not None else spec.user
        # a uid of its owner's has no account to name it: USER and LOGNAME name the owner (unless the job does)
        named = ({k: spec.owner for k in ("USER", "LOGNAME")} if task_identity.dynamic_uid(user) is not None and spec.owner
                 else {})
        return GangLaunch(p.gang_id, p.attempt, tuple(
            LaunchSpec(task_id=m.task_id, job_id=p.job_id, instance=m.instance, attempt=p.attempt,
                       hostname=m.hostname,
                       command=with_env_files(spec.member_command(m.instance), spec.member_env_files(m.instance)),
                       env={**named, **spec.member_env(m.instance), **envs[m.instance],
                            "PELOTON_PREEMPTION_GRACE": f"{spec.preemption_grace_s:g}"},
                       resources=m.resources, gpu_ids=m.gpu_ids, ports=m.ports, files=files,
                       container_image=spec.member_container_image(m.instance), user=user,
                       legacy_user=spec.run_as is None)
            for m in p.members))

    def _apply_results(self, results: Sequence[LaunchResult]) -> None:
        def apply(views: Views, now: float) -> policy.Effects:
            eff = policy.Effects()
            for r in results:
                job_id, idx = split_gang_id(r.gang_id)
                jv = views.get(job_id)
                gv = jv.gangs.get(idx) if jv is not None else None
                if jv is None or gv is None or gv.gang.attempt != r.attempt:
                    continue
                if r.outcome == LaunchOutcome.REFUSED:
                    log.info("launch of gang %s attempt %d refused: %s", r.gang_id, r.attempt, r.message)
                    eff.merge(policy.launch_refused(jv, gv, r.attempt, now, r.message))
                else:
                    log.warning("launch of gang %s failed: %s: %s", r.gang_id, r.task_id, r.message)
                    eff.merge(policy.launch_failed(jv, gv, now, f"{r.task_id}: {r.message}",
                                                   permanent=r.permanent))
            return eff

        self.writer.mutate({split_gang_id(r.gang_id)[0] for r in results}, apply)

