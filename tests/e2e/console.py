"""A sim daemon with tokens and its web console on a port of its own, and a small HTTP client for the console
(the standard library's: a cookie kept by hand, redirects not followed, so each answer is seen as sent)."""

from __future__ import annotations

import http.client
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from peloton.security.identity import add_token
from tests.e2e.harness import Daemon

SPEC = """
name: {name}
instances: {instances}
task:
  command: train.py
  env: {{PELOTON_SIM_DURATION: {duration}}}
  resources: {{cpu: 4, mem: 8Gi, gpu: {gpu}}}
"""
MODEL_SPEC = """
name: {name}
instances: {instances}
model: {{name: tiny, local_bsz: 8}}
placement: {{strategy: model-aware}}
task:
  command: train.py
  env: {{PELOTON_SIM_DURATION: 600s}}
  resources: {{cpu: 2, mem: 4Gi, gpu: 1}}
"""


@dataclass
class ConsoleDaemon(Daemon):
    """Tokens for alice (admin), sam (submitter) and victor (viewer); the CLI calls as the daemon's user over the
    owner-only socket (admin)."""

    ui: str = ""
    tokens: dict[str, str] = field(default_factory=dict)
    auth: bool = True

    def server_args(self) -> list[str]:
        # a settling window of 1 s, not the default 10 (--preemption-settle): the views of a waiting gang's
        # reservation (the queue's held hosts, the map's reserved GPUs) show it after 1 s, where each of those tests
        # waited out 10 s. The default window's rule is the resource manager's (tests/unit/test_preemption.py).
        return ["--backend", "sim", "--sim-hosts", "12", "--sim-host-resources", "cpu=16,mem=64Gi,gpu=8",
                "--sim-racks", "3", "--sim-seed", "1", "--ui-listen", "127.0.0.1:0", "--preemption-settle", "1"]

    def start(self, timeout: float = 60.0, same_address: bool = False, standby: bool = False) -> None:
        if self.auth and not self.tokens:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            path = self.data_dir / "principals.json"
            self.tokens = {"alice": add_token(path, "alice", ["admin"]), "sam": add_token(path, "sam", ["submitter"]),
                           "victor": add_token(path, "victor", ["viewer"])}
        super().start(timeout, same_address, standby)

    def wait_serving(self, timeout: float = 60.0) -> None:
        self.ui = re.search(r"web console on (\S+)", self._line(r"web console on", timeout)).group(1)  # type: ignore[union-attr]
        super().wait_serving(timeout)

    def cli(self, *args: str, check: bool = True, timeout: float = 60) -> Any:
        """As the daemon's user, over the owner-only socket (an admin)."""
        saved, self.address = self.address, f"unix:{self.data_dir / 'peloton.sock'}"
        try:
            return super().cli(*args, check=check, timeout=timeout)
        finally:
            self.address = saved

    def submit(self, tmp: Path, name: str, instances: int = 1, gpu: int = 1, duration: str = "600s") -> str:
        return self.create(SPEC.format(name=name, instances=instances, gpu=gpu, duration=duration), tmp)

    def submit_model_aware(self, tmp: Path, name: str, instances: int = 2) -> str:
        """A model-aware job (docs/model-aware.md) of a model described, not fitted: its plan comes from the cost
        model's prior (stored once)."""
        model = tmp / "tiny-model.json"
        if not json.loads(self.cli("model", "list", "-o", "json").stdout)["models"]:
            model.write_text(json.dumps({"kind": "peloton.model/v1", "name": "tiny", "description": {
                "parameters": 100_000_000, "flops_per_sample": 2.5e11, "local_bsz": 8}}))
            self.cli("model", "create", "tiny", "-f", str(model))
        return self.create(MODEL_SPEC.format(name=name, instances=instances), tmp)

    def audit(self, principal: str) -> list[dict[str, Any]]:
        return list(json.loads(self.cli("audit", "--principal", principal, "-o", "json").stdout)["events"])


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Browser:
    """What a browser sends: the session cookie once logged in, the console's Origin on a POST."""

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.origin = f"http://{self.host}:{self.port}"
        self.cookie = ""

    def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
                timeout: float = 20) -> Answer:
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        h = {"Host": f"{self.host}:{self.port}", **({"Cookie": self.cookie} if self.cookie else {})}
        if method == "POST":
            h["Origin"] = self.origin
            h["Content-Type"] = "application/x-www-form-urlencoded"
        h.update(headers or {})
        h = {k: v for k, v in h.items() if v is not None}
        try:
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            c.close()

    def get(self, path: str, **kw: Any) -> Answer:
        return self.request("GET", path, **kw)

    def login(self, token: str) -> Answer:
        a = self.request("POST", "/login", urlencode({"token": token}).encode())
        m = re.match(r"peloton_console=([^;]*)", a.headers.get("set-cookie", ""))
        if m:
            self.cookie = f"peloton_console={m.group(1)}"
        return a

    def csrf(self) -> str:
        return str(self.get("/api/session").json()["csrf"])

    def post(self, path: str, csrf: str | None = "", **kw: Any) -> Answer:
        headers = dict(kw.pop("headers", {}))
        if csrf is not None:
            headers["X-CSRF-Token"] = csrf or self.csrf()
        return self.request("POST", path, headers=headers, **kw)


def wait_for(pred: Any, timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class EventStream:
    """An event stream of the console read as a browser's EventSource gets it, line by line, on `connection` (an
    http.client connection, plain or HTTPS) with `cookie`."""

    def __init__(self, connection: http.client.HTTPConnection, cookie: str, path: str = "/api/events") -> None:
        self.connection = connection
        connection.request("GET", path, headers={"Cookie": cookie, "Accept": "text/event-stream"})
        self.response = connection.getresponse()
        assert self.response.status == 200, (self.response.status, self.response.read())
        self.lines: list[str] = []
        assert self.response.fp.readline()  # (the stream began: its `retry:`)

    def until_closed(self, within: float) -> float:
        """Read on until the console ends the stream; when it did (monotonic). An AssertionError if it goes on
        past `within` seconds (a heartbeat every 5 s keeps a read from blocking longer)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            line = self.response.fp.readline()
            if not line:
                self.connection.close()
                return time.monotonic()
            self.lines.append(line.decode().rstrip("\n"))
        self.connection.close()
        raise AssertionError(f"the event stream went on for {within}s: {self.lines[-6:]}")

    def failed(self) -> dict[str, Any] | None:
        """The data of the stream's `failed` event, if it sent one."""
        for i, line in enumerate(self.lines[:-1]):
            if line == "event: failed" and self.lines[i + 1].startswith("data: "):
                return dict(json.loads(self.lines[i + 1][6:]))
        return None


def settled(cond: Any) -> Any:
    """A browser wait's condition `cond`, read as false while the page navigates: the driver answers a question
    asked then with an error ("aborted by navigation"), which would end the wait instead of asking again."""
    from selenium.common.exceptions import WebDriverException  # (the browser tests' own: selenium is optional)

    def check(dr: Any) -> Any:
        try:
            return cond(dr)
        except WebDriverException as e:
            if "aborted by navigation" in str(e):
                return False
            raise

    return check
