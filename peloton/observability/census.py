"""Gauges read when Prometheus scrapes, not kept up to date on the hot path: jobs, gangs and tasks by state (from
the store, at most every CENSUS_EVERY_S), and the cluster's hosts, capacity and allocation per resource (from the
host manager's memory). The collectors are registered at import, so every metric name is in the registry (the
deploy/ checks read it), and yield samples once the daemon attaches its job manager or host manager."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from peloton.domain.resources import BASE_UNITS

log = logging.getLogger(__name__)

CENSUS_EVERY_S = 15.0  # the store's counts are read again at most this often
COUNT_WAIT_S = 30.0  # a scrape waits at most this long for the count another scrape is making
DEFAULT_HOST_SERIES_LIMIT = 1000  # --metrics-host-limit
RESOURCES = ("cpu", "mem", "disk", "gpu")
SCALE = BASE_UNITS  # cpu in cores, mem and disk in bytes, gpu a count


class StoreCensus(Collector):
    """peloton_jobs, peloton_gangs, peloton_tasks {state}: counted in the store."""

    def __init__(self, every_s: float = CENSUS_EVERY_S) -> None:
        self.every_s = every_s
        self._count: Callable[[], dict[str, dict[str, int]]] | None = None
        self._mu = threading.Lock()  # guards the fields below (memory only: the store is read outside it)
        self._counted = threading.Condition(self._mu)  # a count ended
        self._counting = False
        self._attached = 0  # which attach() the count in flight belongs to (a count for an older one is dropped)
        self._last: dict[str, dict[str, int]] = {}
        self._at = 0.0

    def attach(self, count: Callable[[], dict[str, dict[str, int]]] | None) -> None:
        with self._mu:
            self._count, self._last, self._at = count, {}, 0.0
            self._attached += 1

    def _counts(self) -> dict[str, dict[str, int]]:
        """One scrape counts at a time, with no lock held across the store's query; scrapes meanwhile wait for its
        answer."""
        with self._mu:
            if self._counting:
                self._counted.wait(COUNT_WAIT_S)
                return self._last
            count, attached = self._count, self._attached
            if count is None or time.monotonic() - self._at < self.every_s:
                return self._last
            self._counting = True
        counts = None
        try:
            counts = count()
        except Exception as e:  # noqa: BLE001 - the store is away: the last counts, or none
            log.debug("census: %s", e)
        finally:
            with self._mu:
                self._counting = False
                if attached == self._attached:
                    if counts is not None:
                        self._last = counts
                    self._at = time.monotonic()
                self._counted.notify_all()
                last = self._last
        return last

    def collect(self) -> Iterator[GaugeMetricFamily]:
        counts = self._counts()
        for what in ("jobs", "gangs", "tasks"):
            g = GaugeMetricFamily(f"peloton_{what}", f"{what.capitalize()} in the store, by state (counted at most "
                                  f"every {self.every_s:g} s)", labels=["state"])
            for state, n in sorted(counts.get(what, {}).items()):
                g.add_metric([state], n)
            yield g


def _have(info: Any) -> list[float]:
    """A host's capacity as exported, per resource of RESOURCES."""
    return [float(getattr(info.capacity, r)) * SCALE[r] for r in RESOURCES]


def _used(info: Any) -> list[float]:
    return [float(getattr(info.allocated, r)) * SCALE[r] for r in RESOURCES]


class ExactSum:
    """A sum of floats kept exactly, as an integer count of 2**-k (every float is a whole multiple of a power of
    two): adding and taking away values in any order ends where summing the values left anew ends, and `value` is
    that exact sum rounded once (as math.fsum). Small: k is the finest fraction seen (a whole-number sum stays a
    plain int)."""

    __slots__ = ("n", "k")

    def __init__(self) -> None:
        self.n, self.k = 0, 0

    def add(self, v: float, sign: int = 1) -> None:
        num, den = v.as_integer_ratio()
        k = den.bit_length() - 1  # den is 2**k
        if k > self.k:
            self.n <<= k - self.k
            self.k = k
        self.n += sign * (num << (self.k - k))

    @property
    def value(self) -> float:
        return self.n / (1 << self.k)  # int / int is correctly rounded


def exact_sum(values: Iterable[float]) -> float:
    """What the census reports for a sum of hosts' figures: their exact sum, rounded once."""
    total = ExactSum()
    for v in values:
        total.add(v)
    return total.value


class ClusterCensus(Collector):
    """peloton_hosts {state}, peloton_cluster_capacity / _allocated {resource}, peloton_host_capacity / _allocated
    {host, resource} (8 series a host: what `host list` shows), peloton_hostmgr_offers_held.

    Kept incrementally: each scrape takes one snapshot of the hosts (`hosts()`, a list of references) and updates
    the totals with the hosts whose HostInfo or state changed since the last scrape; the families are built again
    only when something changed (an unchanged cluster is answered with the last ones). Sums are exact (kept as
    integers: ExactSum), so the figures are those a full recount gives whatever the order of changes. `_mu` serialises
    scrapes (two at once would update the totals twice); nothing on the scheduling path takes it."""

    def __init__(self) -> None:
        self._hosts: Callable[[], list[tuple[Any, str]]] | None = None
        self._host_limit = DEFAULT_HOST_SERIES_LIMIT
        self._said = False
        self._mu = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        # each host's HostInfo and state as last counted (a reference to what the backend keeps anyway)
        self._rows: dict[str, tuple[Any, str]] = {}
        self._states: dict[str, int] = {}
        self._have_up = [ExactSum() for _ in RESOURCES]  # over the hosts that are up
        self._used = [ExactSum() for _ in RESOURCES]  # over every host
        self._held = 0
        self._families: tuple[GaugeMetricFamily, ...] | None = None  # the last ones; None: build them again

    def attach(self, hosts: Callable[[], list[tuple[Any, str]]] | None,
               host_limit: int = DEFAULT_HOST_SERIES_LIMIT) -> None:
        """`hosts()`: (HostInfo, state) for each host; state as `host list` shows it (up, draining, unhealthy...).
        `host_limit`: the per-host series are exported while there are at most this many hosts (0: never): 8 a
        host, they cost a 20,000-host cluster 160,000 series and ~100 MiB a scrape."""
        with self._mu:
            self._hosts = hosts
            self._host_limit = host_limit
            self._reset()

    def _add(self, info: Any, state: str, sign: int) -> None:
        """Count a host in (sign 1) or out (-1); its figures are worked out from its HostInfo again, the same way,
        so taking it out takes away exactly what counting it in added."""
        self._states[state] = self._states.get(state, 0) + sign
        if not self._states[state]:
            del self._states[state]
        self._held += sign * bool(info.holds_offer)
        for total, v in zip(self._used, _used(info), strict=True):
            total.add(v, sign)
        if state == "up":
            for total, v in zip(self._have_up, _have(info), strict=True):
                total.add(v, sign)

    def _update(self, hosts: list[tuple[Any, str]]) -> None:
        """Bring the totals to `hosts` (with `_mu` held): only the hosts that changed are recounted."""
        rows = self._rows
        get = rows.get
        changed = False
        for h, state in hosts:
            row = get(h.hostname)
            if row is not None:
                was, was_state = row
                if was is h and was_state == state:  # the usual host: checked inline, 100,000 a scrape
                    continue
                if was_state == state and (  # a backend that builds its HostInfo anew (Mesos): compare
                        was.capacity == h.capacity and was.allocated == h.allocated
                        and was.holds_offer == h.holds_offer):
                    rows[h.hostname] = (h, state)
                    continue
                self._add(was, was_state, -1)
            rows[h.hostname] = (h, state)
            self._add(h, state, +1)
            changed = True
        if len(rows) != len(hosts):  # hosts went away
            names = {h.hostname for h, _ in hosts}
            for name in [n for n in rows if n not in names]:
                self._add(*rows.pop(name), -1)
            changed = True
        if changed:
            self._families = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._mu:
            source = self._hosts
            hosts = source() if source is not None else []
            self._update(hosts)
            if self._families is None:
                self._families = self._build(hosts, source is not None)
            families = self._families
        yield from families

    def _build(self, hosts: list[tuple[Any, str]], attached: bool) -> tuple[GaugeMetricFamily, ...]:
        by_state = GaugeMetricFamily("peloton_hosts", "Hosts the host manager knows, by state", labels=["state"])
        units = "cpu in cores, mem and disk in bytes, gpu in devices"
        capacity = GaugeMetricFamily("peloton_cluster_capacity", f"What the hosts that are up have in all; {units}",
                                     labels=["resource"])
        allocated = GaugeMetricFamily("peloton_cluster_allocated", f"What the tasks on all hosts hold; {units}",
                                      labels=["resource"])
        host_cap = GaugeMetricFamily("peloton_host_capacity", f"What each host has, whatever its state; {units}",
                                     labels=["host", "resource"])
        host_used = GaugeMetricFamily("peloton_host_allocated", f"What the tasks on each host hold; {units}",
                                      labels=["host", "resource"])
        offers = GaugeMetricFamily("peloton_hostmgr_offers_held", "Hosts whose offer the backend holds unused (Mesos)")
        if attached:
            per_host = 0 < len(hosts) <= self._host_limit
            if not per_host and hosts and self._host_limit and not self._said:
                self._said = True
                log.warning("metrics: %d hosts, more than --metrics-host-limit %d: no per-host series "
                            "(peloton_host_capacity/_allocated); the cluster's totals are exported", len(hosts),
                            self._host_limit)
            if per_host:
                for h, _ in hosts:
                    for r, have, used in zip(RESOURCES, _have(h), _used(h), strict=True):
                        host_cap.add_metric([h.hostname, r], have)
                        host_used.add_metric([h.hostname, r], used)
            for state, n in sorted(self._states.items()):
                by_state.add_metric([state], n)
            for i, r in enumerate(RESOURCES):
                capacity.add_metric([r], self._have_up[i].value)
                allocated.add_metric([r], self._used[i].value)
            offers.add_metric([], self._held)
        return by_state, capacity, allocated, host_cap, host_used, offers


STORE = StoreCensus()
CLUSTER = ClusterCensus()
REGISTRY.register(STORE)
REGISTRY.register(CLUSTER)
