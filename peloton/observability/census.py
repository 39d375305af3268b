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


class _Row:
    """One host's part of the census, kept between scrapes: a host whose HostInfo object and state are the same
    ones as at the last scrape (backends keep a host's HostInfo until it changes) costs an identity check."""

    __slots__ = ("info", "state", "have", "used", "have_fx", "used_fx")

    def __init__(self, info: Any, state: str) -> None:
        self.info, self.state = info, state
        self.have = tuple(float(getattr(info.capacity, r)) * SCALE[r] for r in RESOURCES)
        self.used = tuple(float(getattr(info.allocated, r)) * SCALE[r] for r in RESOURCES)
        self.have_fx = tuple(_fixed(v) for v in self.have)
        self.used_fx = tuple(_fixed(v) for v in self.used)


_FX = 1074  # every finite float is a whole multiple of 2**-1074: sums kept in those units are exact integers


def _fixed(v: float) -> int:
    """`v` in units of 2**-1074, exactly (its denominator is a power of two)."""
    n, d = v.as_integer_ratio()
    return n << (_FX + 1 - d.bit_length())


def _float(fx: int) -> float:
    return fx / (1 << _FX)  # int / int is correctly rounded: the exact sum, rounded once


def exact_sum(values: Iterable[float]) -> float:
    """What the census reports for a sum: the exact sum of `values` rounded once (math.fsum), so that adding and
    taking away hosts one at a time gives the same figure as summing them all anew."""
    return _float(sum(_fixed(v) for v in values))


class ClusterCensus(Collector):
    """peloton_hosts {state}, peloton_cluster_capacity / _allocated {resource}, peloton_host_capacity / _allocated
    {host, resource} (8 series a host: what `host list` shows), peloton_hostmgr_offers_held.

    Kept incrementally: each scrape takes one snapshot of the hosts (`hosts()`, a list of references) and updates
    the totals with the hosts whose HostInfo or state changed since the last scrape; the families are built again
    only when something changed (an unchanged cluster is answered with the last ones). Sums are exact (kept as
    integers), so the figures are those a full recount gives whatever the order of changes. `_mu` serialises
    scrapes (two at once would update the totals twice); nothing on the scheduling path takes it."""

    def __init__(self) -> None:
        self._hosts: Callable[[], list[tuple[Any, str]]] | None = None
        self._host_limit = DEFAULT_HOST_SERIES_LIMIT
        self._said = False
        self._mu = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._rows: dict[str, _Row] = {}
        self._states: dict[str, int] = {}
        self._have_up = [0] * len(RESOURCES)  # exact sums (units of 2**-1074) over the hosts that are up
        self._used = [0] * len(RESOURCES)  # over every host
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

    def _add(self, row: _Row, sign: int) -> None:
        self._states[row.state] = self._states.get(row.state, 0) + sign
        if not self._states[row.state]:
            del self._states[row.state]
        self._held += sign * bool(row.info.holds_offer)
        up = row.state == "up"
        for i in range(len(RESOURCES)):
            self._used[i] += sign * row.used_fx[i]
            if up:
                self._have_up[i] += sign * row.have_fx[i]

    def _update(self, hosts: list[tuple[Any, str]]) -> None:
        """Bring the totals to `hosts` (with `_mu` held): only the hosts that changed are recounted."""
        rows = self._rows
        get = rows.get
        changed = False
        for h, state in hosts:
            row = get(h.hostname)
            if row is not None:
                if row.info is h and row.state == state:  # the usual host: checked inline, 100,000 a scrape
                    continue
                if row.state == state and (  # a backend that builds its HostInfo anew (Mesos): compare
                        row.info.capacity == h.capacity and row.info.allocated == h.allocated
                        and row.info.holds_offer == h.holds_offer):
                    row.info = h
                    continue
                self._add(row, -1)
            row = rows[h.hostname] = _Row(h, state)
            self._add(row, +1)
            changed = True
        if len(rows) != len(hosts):  # hosts went away
            names = {h.hostname for h, _ in hosts}
            for name in [n for n in rows if n not in names]:
                self._add(rows.pop(name), -1)
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
                    row = self._rows[h.hostname]
                    for i, r in enumerate(RESOURCES):
                        host_cap.add_metric([h.hostname, r], row.have[i])
                        host_used.add_metric([h.hostname, r], row.used[i])
            for state, n in sorted(self._states.items()):
                by_state.add_metric([state], n)
            for i, r in enumerate(RESOURCES):
                capacity.add_metric([r], _float(self._have_up[i]))
                allocated.add_metric([r], _float(self._used[i]))
            offers.add_metric([], self._held)
        return by_state, capacity, allocated, host_cap, host_used, offers


STORE = StoreCensus()
CLUSTER = ClusterCensus()
REGISTRY.register(STORE)
REGISTRY.register(CLUSTER)
