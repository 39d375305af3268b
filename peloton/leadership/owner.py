"""Who holds a lock, as it records itself where the next process can read it (the store's `meta` table, or the
SQLite lock file: lock.py) and as a standby names it to callers (standby.py): plain data, no store, no gRPC."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass

LEASE_S = 6.0  # a holder silent for longer is ended by a standby (--leader-lease)


@dataclass(frozen=True, slots=True)
class Owner:
    host: str
    pid: int
    address: str
    since: float
    session: str = ""  # the application_name of its store connections
    lease: float = LEASE_S
    # What a standby must share to adopt its tasks (standby.py; "" where it runs no host manager, or was recorded by
    # a release before these): the host manager's backend, and on the local backend the machine (its boot and PID
    # namespace: the processes it can see) and the data dir (its id file, and its path to name it by).
    backend: str = ""
    machine: str = ""
    data_dir: str = ""
    data_dir_id: str = ""

    @staticmethod
    def me(address: str, session: str = "", lease: float = LEASE_S, *, backend: str = "", machine: str = "",
           data_dir: str = "", data_dir_id: str = "") -> Owner:
        return Owner(socket.gethostname(), os.getpid(), address, time.time(), session, lease, backend, machine,
                     data_dir, data_dir_id)

    def to_json(self) -> str:
        return json.dumps({"host": self.host, "pid": self.pid, "address": self.address, "since": self.since,
                           "session": self.session, "lease": self.lease, "backend": self.backend,
                           "machine": self.machine, "data_dir": self.data_dir, "data_dir_id": self.data_dir_id})

    @staticmethod
    def from_json(text: str | None) -> Owner | None:
        try:
            d = json.loads(text or "")
            return Owner(str(d["host"]), int(d["pid"]), str(d.get("address", "")), float(d["since"]),
                         str(d.get("session", "")), float(d.get("lease", LEASE_S)), str(d.get("backend", "")),
                         str(d.get("machine", "")), str(d.get("data_dir", "")), str(d.get("data_dir_id", "")))
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        at = f", serving {self.address}" if self.address else ""
        return f"pid {self.pid} on host {self.host}{at}, since {since}"
