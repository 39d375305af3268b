"""Loaded by a daemon that scripts/local_stages.py starts (PYTHONPATH names this directory; the spawners run with
`-I -S` and never load it): when PELOTON_STAGE_TRACE names a file, wraps the functions on the way from CreateJob to
every member RUNNING so that each call that did something appends `name enter exit` (CLOCK_MONOTONIC seconds, the
clock the benchmark's client reads too) to that file. A measuring aid, never part of a daemon's run otherwise."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

_PATH = os.environ.get("PELOTON_STAGE_TRACE")


def _nonempty(r: Any) -> bool:
    """A long poll's answer that carried something (a tuple: its first item)."""
    if isinstance(r, tuple):
        r = r[0]
    if hasattr(r, "placements"):
        return bool(r.placements)
    if hasattr(r, "gangs"):
        return bool(r.gangs)
    if hasattr(r, "events"):
        return bool(r.events)
    return bool(r)


def _install(fd: int) -> None:
    from peloton.hostmgr import manager as hm
    from peloton.hostmgr.local import backend, journal, spawn
    from peloton.jobmgr import launcher, service
    from peloton.jobmgr import manager as jm
    from peloton.resmgr import manager as rm

    def wrap(owner: Any, attr: str, name: str, keep: Callable[[tuple[Any, ...], dict[str, Any], Any], bool]) -> None:
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            t0 = time.monotonic()
            r = fn(*args, **kwargs)
            if keep(args, kwargs, r):
                os.write(fd, f"{name} {t0:.6f} {time.monotonic():.6f}\n".encode())
            return r

        setattr(owner, attr, traced)

    def always(a: tuple[Any, ...], k: dict[str, Any], r: Any) -> bool:
        return True

    def result(a: tuple[Any, ...], k: dict[str, Any], r: Any) -> bool:
        return _nonempty(r)

    def first_arg(a: tuple[Any, ...], k: dict[str, Any], r: Any) -> bool:
        return len(a) > 1 and bool(a[1])

    wrap(service.JobServicer, "CreateJob", "api", always)
    wrap(rm.ResourceManager, "enqueue", "enqueue", first_arg)
    wrap(rm.ResourceManager, "dequeue", "dequeue", result)
    wrap(rm.ResourceManager, "set_placements", "set_placements", first_arg)
    wrap(rm.ResourceManager, "take_placements", "take_placements", result)
    wrap(launcher.Launcher, "_launch", "launcher", always)
    wrap(launcher.Launcher, "_send_launch", "send_launch", always)
    wrap(hm.HostManager, "launch", "hostmgr_launch", always)
    wrap(backend.LocalBackend, "launch", "backend_launch", always)
    wrap(journal.Journal, "append", "journal_durable", lambda a, k, r: bool(k.get("durable")))
    # the journal thread's write of a batch with a durable record (its fsync), timed on its own
    wrap(journal.Journal, "_write", "journal_fsync", lambda a, k, r: any(f is not None for _, f in a[1]))
    wrap(spawn.SpawnerPool, "spawn_many", "spawn_many", first_arg)
    wrap(hm.HostManager, "_on_statuses", "statuses_handed", first_arg)
    wrap(hm.HostManager, "wait_events", "wait_events", result)
    wrap(jm.JobManager, "apply_statuses", "apply_statuses", first_arg)


if _PATH:
    # the daemon is `python -m peloton.cli.main` in its checkout (harness.Daemon's cwd), whose code it must run:
    # `-m` puts the cwd first only after this module ran
    sys.path.insert(0, os.getcwd())
    _install(os.open(_PATH, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
