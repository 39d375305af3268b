"""Gauges read when Prometheus scrapes, not kept up to date on the hot path: jobs, gangs and tasks by state (from
the store, at most every CENSUS_EVERY_S), and the cluster's hosts, capacity and allocation per resource (from the
host manager's memory). The collectors are registered at import, so every metric name is in the registry (the
deploy/ checks read it), and yield samples once the daemon attaches its job manager or host manager."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
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


class ClusterCensus(Collector):
    """peloton_hosts {state}, peloton_cluster_capacity / _allocated {resource}, peloton_host_capacity / _allocated
    {host, resource} (8 series a host: what `host list` shows), peloton_hostmgr_offers_held."""

    def __init__(self) -> None:
        self._hosts: Callable[[], list[tuple[Any, str]]] | None = None
        self._host_limit = DEFAULT_HOST_SERIES_LIMIT
        self._said = False

    def attach(self, hosts: Callable[[], list[tuple[Any, str]]] | None,
               host_limit: int = DEFAULT_HOST_SERIES_LIMIT) -> None:
        """`hosts()`: (HostInfo, state) for each host; state as `host list` shows it (up, draining, unhealthy...).
        `host_limit`: the per-host series are exported while there are at most this many hosts (0: never): 8 a
        host, built at every scrape, they cost a 20,000-host cluster 160,000 series and ~100 MiB a scrape."""
        self._hosts = hosts
        self._host_limit = host_limit

    def collect(self) -> Iterator[GaugeMetricFamily]:
        hosts = self._hosts() if self._hosts is not None else []
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
        if self._hosts is not None:
            states: dict[str, int] = {}
            cap = dict.fromkeys(RESOURCES, 0.0)
            used = dict.fromkeys(RESOURCES, 0.0)
            held = 0
            per_host = 0 < len(hosts) <= self._host_limit
            if not per_host and hosts and self._host_limit and not self._said:
                self._said = True
                log.warning("metrics: %d hosts, more than --metrics-host-limit %d: no per-host series "
                            "(peloton_host_capacity/_allocated); the cluster's totals are exported", len(hosts),
                            self._host_limit)
            for h, state in hosts:
                states[state] = states.get(state, 0) + 1
                held += bool(h.holds_offer)
                for r in RESOURCES:
                    have, held_r = float(getattr(h.capacity, r)) * SCALE[r], float(getattr(h.allocated, r)) * SCALE[r]
                    if per_host:
                        host_cap.add_metric([h.hostname, r], have)
                        host_used.add_metric([h.hostname, r], held_r)
                    used[r] += held_r
                    if state == "up":
                        cap[r] += have
            for state, n in sorted(states.items()):
                by_state.add_metric([state], n)
            for r in RESOURCES:
                capacity.add_metric([r], cap[r])
                allocated.add_metric([r], used[r])
            offers.add_metric([], held)
        yield from (by_state, capacity, allocated, host_cap, host_used, offers)


STORE = StoreCensus()
CLUSTER = ClusterCensus()
REGISTRY.register(STORE)
REGISTRY.register(CLUSTER)
