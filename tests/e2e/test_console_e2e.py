"""The web console over plain HTTP (no browser): login and sessions, CSRF, the API's permissions and audit behind
each action, paging bounds and bad input (a clear error naming the parameter), the event stream and its resume,
against the real daemon on the sim backend (docs/ui.md)."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from peloton.console.server import MAX_STREAMS
from peloton.security.identity import add_token
from tests.e2e.console import Browser, ConsoleDaemon, EventStream, wait_for
from tests.e2e.harness import PELOTON, serving

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleDaemon]:
    tmp = tmp_path_factory.mktemp("console")
    d = ConsoleDaemon(tmp / "data", f"sqlite:///{tmp / 'peloton.db'}")
    with serving(d):
        yield d


def logged_in(d: ConsoleDaemon, who: str) -> Browser:
    b = Browser(d.ui)
    assert b.login(d.tokens[who]).status == 303
    return b


def test_without_a_session_pages_send_to_the_login_and_the_api_answers_401(daemon: ConsoleDaemon) -> None:
    b = Browser(daemon.ui)
    for page, to in (("/", "/login"), ("/jobs?state=RUNNING", "/login?next=%2Fjobs%3Fstate%3DRUNNING"),
                     ("/jobs/0123456789ab", "/login?next=%2Fjobs%2F0123456789ab")):
        a = b.get(page)
        assert (a.status, a.headers["location"]) == (303, to), page
    a = b.get("/api/session")
    assert a.status == 401 and a.json()["code"] == "Unauthenticated"
    login = b.get("/login")
    assert login.status == 200 and b'name="token"' in login.body
    assert "script-src 'self'" in login.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in login.headers["content-security-policy"]


def test_an_unknown_token_is_refused_and_a_known_one_opens_a_strict_httponly_session(daemon: ConsoleDaemon) -> None:
    b = Browser(daemon.ui)
    a = b.login("pt_not-a-token-of-this-daemon")
    assert (a.status, a.headers["location"]) == (303, "/login?failed=unknown")
    assert "set-cookie" not in a.headers
    a = b.login(daemon.tokens["victor"])
    assert (a.status, a.headers["location"]) == (303, "/")
    cookie = a.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    s = b.get("/api/session").json()
    assert (s["name"], s["roles"], s["via"]) == ("victor", ["viewer"], "token")
    assert not s["may_control_any"] and not s["may_control_own"] and len(s["csrf"]) == 32
    assert b.get("/").status == 200


def test_a_login_goes_back_to_the_page_asked_for_and_nowhere_else(daemon: ConsoleDaemon) -> None:
    """The page a browser without a session asked for (`next`, from the redirect to the login) is where the login
    goes, a failed one keeping it; anything but one of this console's pages goes to the cluster view."""
    b = Browser(daemon.ui)
    a = b.request("POST", "/login", urlencode({"token": "pt_not-a-token-of-this-daemon", "next": "/queue"}).encode())
    assert a.headers["location"] == "/login?failed=unknown&next=%2Fqueue"
    for given, to in (("/jobs/0123456789ab", "/jobs/0123456789ab"), ("/jobs?state=RUNNING&q=a b", None),
                      ("//evil.example/jobs", "/"), ("https://evil.example/", "/"), ("/\\evil.example", "/"),
                      ("/assets/app.js", "/"), ("/jobs\r\nSet-Cookie: x=1", "/"), ("", "/")):
        a = b.request("POST", "/login", urlencode({"token": daemon.tokens["victor"], "next": given}).encode())
        assert (a.status, a.headers["location"]) == (303, to or given.replace(" ", "+")), given


def test_a_login_from_another_site_is_refused(daemon: ConsoleDaemon) -> None:
    b = Browser(daemon.ui)
    a = b.request("POST", "/login", f"token={daemon.tokens['alice']}".encode(),
                  headers={"Origin": "http://evil.example"})
    assert a.status == 403 and a.json()["field"] == "Origin" and "set-cookie" not in a.headers


def test_a_request_addressed_to_another_name_is_refused(daemon: ConsoleDaemon) -> None:
    """DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 reaches the port, but its
    requests carry Host: evil.example."""
    b = logged_in(daemon, "alice")
    a = b.get("/api/session", headers={"Host": "evil.example:80"})
    assert a.status == 421 and a.json()["field"] == "Host"
    assert b.get("/api/session", headers={"Host": f"localhost:{b.port}"}).status == 200


def test_stop_needs_the_csrf_token_and_this_consoles_origin(daemon: ConsoleDaemon, tmp_path: Path) -> None:
    job = daemon.submit(tmp_path, "csrf")
    b = logged_in(daemon, "alice")
    for csrf, headers in ((None, {}), ("0" * 32, {}), ("", {"Origin": "http://evil.example"}),
                          ("", {"Sec-Fetch-Site": "cross-site"})):
        a = b.post(f"/api/jobs/{job}/stop", csrf=csrf, headers=headers)
        assert a.status == 403 and a.json()["field"] == "X-CSRF-Token", (csrf, headers, a.body)
    assert daemon.state(job) not in ("KILLING", "KILLED")
    a = b.post(f"/api/jobs/{job}/stop")
    assert (a.status, a.json()) == (200, {"stopped": job})
    daemon.wait_state(job, "KILLED")
    assert any(e["method"].endswith("StopJob") and e["object"] == job and e["allowed"] for e in daemon.audit("alice"))


def test_a_viewers_forged_stop_is_refused_by_the_api_and_audited(daemon: ConsoleDaemon, tmp_path: Path) -> None:
    job = daemon.submit(tmp_path, "forged")
    b = logged_in(daemon, "victor")
    a = b.post(f"/api/jobs/{job}/stop")  # a well-formed request from the viewer's own session
    assert a.status == 403 and a.json()["code"] == "PermissionDenied"
    assert "victor may not call StopJob" in a.json()["error"]
    assert daemon.state(job) not in ("KILLING", "KILLED")
    denied = [e for e in daemon.audit("victor") if e["method"].endswith("StopJob")]
    assert denied and not denied[0]["allowed"] and denied[0]["code"] == "PERMISSION_DENIED"


def test_a_submitter_may_stop_only_its_own_jobs(daemon: ConsoleDaemon, tmp_path: Path) -> None:
    job = daemon.submit(tmp_path, "not-sams")  # the daemon's user owns it
    b = logged_in(daemon, "sam")
    a = b.post(f"/api/jobs/{job}/stop")
    assert a.status == 403 and "sam" in a.json()["error"]


def test_the_job_list_pages_on_the_server_and_filters(daemon: ConsoleDaemon, tmp_path: Path) -> None:
    made = {daemon.submit(tmp_path, f"paged-{i}", gpu=0) for i in range(5)}
    b = logged_in(daemon, "victor")
    seen: list[str] = []
    token, pages = "", 0
    while True:
        page = b.get(f"/api/jobs?q=paged-&page_size=2&page_token={token}").json()
        assert len(page["jobs"]) <= 2
        seen += [j["id"] for j in page["jobs"]]
        pages += 1
        token = page["next_page_token"]
        if not token:
            break
    assert set(seen) == made and len(seen) == 5 and pages == 3
    running = wait_for(lambda: len(b.get("/api/jobs?q=paged-&state=RUNNING").json()["jobs"]) == 5,
                       what="the five jobs RUNNING")
    assert running
    assert b.get("/api/jobs?q=paged-&state=SUCCEEDED,FAILED").json()["jobs"] == []
    assert b.get("/api/jobs?q=paged-&owner=nobody-like-this").json()["jobs"] == []


@pytest.mark.parametrize(("query", "field", "words"), [
    ("page_size=0", "page_size", "between 1 and 500"),
    ("page_size=501", "page_size", "between 1 and 500"),
    ("page_size=ten", "page_size", "whole number"),
    ("page_size=1&page_size=2", "page_size", "given 2 times"),
    ("state=SLEEPING", "state", "not a job state"),
    ("pool=research", "pool", "starts with '/'"),
    ("page_token=%3Cscript%3E", "page_token", "not a page token"),
    ("owner=" + "x" * 300, "owner", "at most 256"),
    ("colour=red", "colour", "not a parameter of /api/jobs"),
])
def test_bad_list_parameters_are_refused_naming_the_parameter(daemon: ConsoleDaemon, query: str, field: str,
                                                               words: str) -> None:
    a = logged_in(daemon, "victor").get(f"/api/jobs?{query}")
    assert a.status == 400, a.body
    body = a.json()
    assert body["field"] == field and words in body["error"] and body["code"] == "InvalidArgument"


def test_a_job_page_shows_gangs_members_and_a_bad_or_unknown_id_says_so(daemon: ConsoleDaemon,
                                                                         tmp_path: Path) -> None:
    job = daemon.submit(tmp_path, "gang", instances=3, gpu=4)
    b = logged_in(daemon, "victor")
    j = wait_for(lambda: (lambda j: j if j["state"] == "RUNNING" else None)(b.get(f"/api/jobs/{job}").json()),
                 what="the job RUNNING")
    assert [g["instances"] for g in j["gangs"]] == ["0-2"] and j["gangs"][0]["state"] == "RUNNING"
    assert [m["instance"] for m in j["members"]] == [0, 1, 2]
    assert all(m["state"] == "RUNNING" and m["host"].startswith("sim-") and len(m["gpus"]) == 4
               for m in j["members"])
    a = b.get("/api/jobs/not-a-job")
    assert a.status == 400 and a.json()["field"] == "job"
    a = b.get("/api/jobs/0123456789ab")
    assert a.status == 404 and a.json()["code"] == "NotFound"


def test_the_cluster_summary_counts_hosts_and_capacity(daemon: ConsoleDaemon, tmp_path: Path) -> None:
    daemon.wait_state(daemon.submit(tmp_path, "summed"), "RUNNING")
    c = logged_in(daemon, "victor").get("/api/cluster").json()
    assert c["backend"] == "sim" and c["hosts"] == 12 and c["racks"] == 3
    assert c["capacity"]["gpu"] == 96 and c["capacity"]["cpu"] == 192
    assert 0 <= c["allocated"]["gpu"] <= 96 and [p["path"] for p in c["pools"]][0] == "/"
    assert sorted(c["sources"]) == ["gangs", "hosts", "queue"]
    assert sum(c["gpus"].values()) == 96 and c["gpus"].get("used", 0) == c["allocated"]["gpu"]
    assert sum(c["host_states"].values()) == 12
    # gangs by state, from the store; the stage latencies of the gangs that ran
    assert c["gang_states"].get("RUNNING", 0) >= 1, c["gang_states"]
    stages = {g["stage"]: g for g in c["stages"]}
    assert list(stages) == ["queued", "placing", "launched", "launching", "submitted_to_running"]
    run = stages["submitted_to_running"]
    assert run["count"] >= 1 and 0 <= run["p50_s"] <= run["p95_s"] <= run["p99_s"]


def _raw(b: Browser, head: bytes) -> bytes:
    """What the console answers to a request sent as these bytes (b"" when it hangs up without an answer)."""
    with socket.create_connection((b.host, b.port), timeout=20) as s:
        s.sendall(head)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_a_post_with_headers_no_browser_sends_is_answered_not_dropped(daemon: ConsoleDaemon, tmp_path: Path) -> None:
    """Header values are read as Latin-1: a CSRF token of a non-ASCII byte, or a Content-Length of a digit that is
    not ASCII ('²' passes str.isdigit, not int), raised in the handler; the connection was dropped unanswered."""
    job = daemon.submit(tmp_path, "odd-headers")
    b = logged_in(daemon, "alice")
    base = (f"POST /api/jobs/{job}/stop HTTP/1.0\r\nHost: {b.host}:{b.port}\r\nOrigin: {b.origin}\r\n"
            f"Cookie: {b.cookie}\r\n").encode()
    a = _raw(b, base + b"X-CSRF-Token: \xff\r\nContent-Length: 0\r\n\r\n")
    assert a.startswith(b"HTTP/1.0 403 ") and b'"field":"X-CSRF-Token"' in a, a[:300]
    a = _raw(b, base + f"X-CSRF-Token: {b.csrf()}\r\n".encode() + b"Content-Length: \xb2\r\n\r\n")
    assert a.startswith(b"HTTP/1.0 413 ") and b'"field":"Content-Length"' in a, a[:300]
    assert daemon.state(job) not in ("KILLING", "KILLED")


def test_assets_are_served_from_the_package_and_nothing_else(daemon: ConsoleDaemon) -> None:
    b = Browser(daemon.ui)
    js = b.get("/assets/app.js")
    assert js.status == 200 and js.headers["content-type"].startswith("text/javascript")
    assert js.headers["x-content-type-options"] == "nosniff"
    for bad in ("/assets/../server.py", "/assets/server.py", "/assets/nope.js", "/etc/passwd"):
        assert b.get(bad).status == 404, bad


def _events(b: Browser, path: str, last_event_id: str = "",
            ids: list[str] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """(id, data) of each event of an event stream, as a browser's EventSource reads them; `ids` collects every
    id the stream sets (a heartbeat's, without an event, too), as the browser keeps its Last-Event-ID."""
    c = http.client.HTTPConnection(b.host, b.port, timeout=30)
    headers = {"Cookie": b.cookie, "Accept": "text/event-stream", **({"Last-Event-ID": last_event_id}
                                                                      if last_event_id else {})}
    c.request("GET", path, headers=headers)
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream"
    try:
        ev_id, data = "", ""
        while True:
            line = r.fp.readline().decode()
            if not line:
                return
            line = line.rstrip("\n")
            if line.startswith("id: "):
                ev_id = line[4:]
                if ids is not None:
                    ids.append(ev_id)
            elif line.startswith("data: "):
                data = line[6:]
            elif not line and data:
                yield ev_id, json.loads(data)
                ev_id, data = "", ""
    finally:
        c.close()


def test_the_event_stream_forwards_watchjobs_and_resumes_after_last_event_id(daemon: ConsoleDaemon,
                                                                             tmp_path: Path) -> None:
    job = daemon.submit(tmp_path, "watched")
    daemon.wait_state(job, "RUNNING")
    b = logged_in(daemon, "alice")
    stream = _events(b, f"/api/events?job={job}")
    first_id, first = next(stream)
    assert first["snapshot"] and first["changes"][0]["job_id"] == job and first["changes"][0]["state"] == "RUNNING"
    del stream  # the browser goes away: the console notices at the next heartbeat
    assert b.post(f"/api/jobs/{job}/stop").status == 200
    daemon.wait_state(job, "KILLED")
    # the browser comes back with the last id it saw: what changed meanwhile, not a snapshot
    states: list[str] = []
    for _, m in _events(b, f"/api/events?job={job}", last_event_id=first_id):
        assert not m["snapshot"]
        states += [c["state"] for c in m["changes"]]
        if "KILLED" in states:
            break
    assert states[-1] == "KILLED" and "KILLING" in states


def test_a_snapshot_too_large_for_one_message_comes_in_parts_that_set_no_resume_point(daemon: ConsoleDaemon,
                                                                                      tmp_path: Path) -> None:
    """A job of 20,000 tasks: its snapshot (~1 MB of change text) comes in several `more` parts of one revision, the
    job's tasks split among them; only the whole revision's last part sets an id, so a browser reconnecting midway
    resumes from before it (the snapshot again), never after a part."""
    spec = ("name: wide\ninstances: 20000\ngang: {min_available: 40}\n"
            "task: {command: train.py, resources: {cpu: 4, mem: 8Gi, gpu: 1}}\n")
    job = daemon.create(spec, tmp_path)
    try:
        daemon.cli("job", "stop", job)
        daemon.wait_state(job, "KILLED", timeout=120)
        b = logged_in(daemon, "alice")
        ids: list[str] = []
        instances: list[int] = []
        parts = 0
        for _, m in _events(b, f"/api/events?job={job}", ids=ids):
            assert m["snapshot"] and m["changes"][0]["job_id"] == job
            parts += 1
            instances += [t["instance"] for t in m["changes"][0]["tasks"]]
            if not m["more"]:
                break
            assert ids == []  # a part sets no id
        assert parts > 1 and sorted(instances) == list(range(20_000))
        assert len(ids) == 1 and ids[0].rpartition(":")[2].isdigit()
    finally:
        daemon.cli("job", "delete", job, check=False)


def test_a_stream_of_every_job_resumes_after_a_quiet_disconnect(daemon: ConsoleDaemon, tmp_path: Path) -> None:
    """Nothing changed while the browser was connected, yet its reconnect misses nothing: the stream's first
    message (and every heartbeat) set its Last-Event-ID."""
    b = logged_in(daemon, "victor")
    ids: list[str] = []
    c = http.client.HTTPConnection(b.host, b.port, timeout=30)
    c.request("GET", "/api/events", headers={"Cookie": b.cookie})
    r = c.getresponse()
    while not ids:
        line = r.fp.readline().decode()
        assert line, "the stream ended"
        if line.startswith("id: "):
            ids.append(line[4:].strip())
    c.close()
    job = daemon.submit(tmp_path, "while-away")
    seen: list[str] = []
    for _, m in _events(b, "/api/events", last_event_id=ids[-1]):
        assert not m["resync"]
        seen += [ch["job_id"] for ch in m["changes"]]
        if job in seen:
            break
    assert job in seen


def test_a_browser_that_hangs_up_frees_its_stream_at_once(daemon: ConsoleDaemon) -> None:
    """A page reloaded again and again, each load an EventSource and the one before it closed: more loads than
    the console has streams (MAX_STREAMS), well within one heartbeat, are each served, as a hang-up frees its stream
    at once (console/hangups.py), not at the next heartbeat's write."""
    b = logged_in(daemon, "victor")
    for i in range(MAX_STREAMS + 8):
        c = http.client.HTTPConnection(b.host, b.port, timeout=30)
        c.request("GET", "/api/events", headers={"Cookie": b.cookie})
        r = c.getresponse()
        assert r.status == 200, (i, r.status, r.read())
        assert r.fp.readline()  # the stream began
        r.close()
        c.close()


def test_a_head_of_the_event_stream_is_its_headers_alone(daemon: ConsoleDaemon) -> None:
    """HEAD is answered as GET without the body: the event stream's HEAD streamed on (a body HEAD never has, held
    a stream of the console's MAX_STREAMS and a watch of the daemon for as long as the client kept the socket)."""
    b = logged_in(daemon, "victor")
    with socket.create_connection((b.host, b.port), timeout=15) as s:
        s.sendall(f"HEAD /api/events HTTP/1.0\r\nHost: {b.host}:{b.port}\r\nCookie: {b.cookie}\r\n\r\n".encode())
        out, deadline = b"", time.monotonic() + 15
        while time.monotonic() < deadline and (chunk := s.recv(65536)):  # closed once the headers are sent
            out += chunk
        assert time.monotonic() < deadline, f"the console streamed on: {out[:300]!r}"
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 ") and b"Content-Type: text/event-stream" in head, out[:300]
    assert body == b"", body[:300]


def test_event_stream_parameters_are_checked(daemon: ConsoleDaemon) -> None:
    b = logged_in(daemon, "victor")
    a = b.get("/api/events?job=nope")
    assert a.status == 400 and a.json()["field"] == "job"
    a = b.get("/api/events?jobs=0123456789ab")
    assert a.status == 400 and a.json()["field"] == "jobs"


def test_logout_needs_csrf_and_ends_the_session_cookie(daemon: ConsoleDaemon) -> None:
    b = logged_in(daemon, "victor")
    assert b.post("/logout", csrf=None).status == 403
    a = b.post("/logout")
    assert a.status == 303 and "Max-Age=0" in a.headers["set-cookie"]


def test_without_authentication_every_caller_is_the_apis_anonymous_admin(tmp_path: Path) -> None:
    """A daemon that authenticates nobody (loopback, no principals file): the console asks for no login, and the
    caller is who the API says, `anonymous`, an admin (docs/security.md)."""
    d = ConsoleDaemon(tmp_path / "data", f"sqlite:///{tmp_path / 'peloton.db'}", auth=False)
    with serving(d):
        b = Browser(d.ui)
        assert b.get("/").status == 200
        assert b.get("/login").status == 303
        s = b.get("/api/session").json()
        assert (s["name"], s["roles"], s["authenticated"]) == ("anonymous", ["admin"], False)
        job = d.submit(tmp_path, "open")
        assert b.post(f"/api/jobs/{job}/stop", csrf=None).status == 403  # CSRF still: any page could post
        assert b.post(f"/api/jobs/{job}/stop").status == 200


@pytest.mark.parametrize(("query", "field"), [
    ("status=sleeping", "status"), ("page_size=0", "page_size"), ("page_size=1001", "page_size"),
    ("page=1", "page"), ("page_token=a%20b", "page_token"), ("free_gpus=-1", "free_gpus"),
    ("free_gpus=x", "free_gpus"), ("label==x", "label"), ("racks=r1", "racks"),
])
def test_bad_host_parameters_are_refused_naming_the_parameter(daemon: ConsoleDaemon, query: str, field: str) -> None:
    a = logged_in(daemon, "victor").get(f"/api/hosts?{query}")
    assert a.status == 400 and a.json()["field"] == field, a.body


def test_the_host_map_pages_and_filters_on_the_server(daemon: ConsoleDaemon) -> None:
    b = logged_in(daemon, "victor")
    pages, token = [], ""
    for _ in range(4):
        page = b.get(f"/api/hosts?page_size=5&page_token={token}").json()
        pages.append(page)
        token = page["next_page_token"]
        if not token:
            break
    names = [h["hostname"] for page in pages for h in page["hosts"]]
    assert [len(p["hosts"]) for p in pages] == [5, 5, 2] and len(set(names)) == 12
    assert all(p["total"] == 12 and p["racks"] == ["r0", "r1", "r2"] for p in pages)
    keys = [(h["rack"], h["hostname"]) for page in pages for h in page["hosts"]]
    assert keys == sorted(keys)  # rack by rack
    rack = pages[0]["racks"][1]
    in_rack = b.get(f"/api/hosts?rack={rack}").json()["hosts"]
    assert in_rack and all(h["rack"] == rack for h in in_rack)
    one = b.get(f"/api/hosts?q={names[3]}").json()
    assert [h["hostname"] for h in one["hosts"]] == [names[3]] and one["total"] == 1
    assert b.get(f"/api/hosts?label=rack%3D{rack}").json()["total"] == len(in_rack)
    for h in b.get("/api/hosts?free_gpus=8").json()["hosts"]:
        assert h["status"] == "up" and [g["state"] for g in h["gpus"]].count("used") == 0


def test_the_map_says_which_job_holds_each_gpu_and_which_are_stranded_or_reserved(daemon: ConsoleDaemon,
                                                                                 tmp_path: Path) -> None:
    """Twelve members of 7 GPUs leave one GPU free on each of the twelve hosts; a member of 2 GPUs then waits, as
    no host has 2 free: those free GPUs are stranded, except on the host the resource manager keeps for it (after
    its settling time) whose GPU is reserved."""
    admin, viewer = logged_in(daemon, "alice"), logged_in(daemon, "victor")
    for state in ("RUNNING", "PENDING"):  # the jobs of the tests before: an empty cluster
        for j in admin.get(f"/api/jobs?state={state}&page_size=500").json()["jobs"]:
            admin.post(f"/api/jobs/{j['id']}/stop")
    wait_for(lambda: viewer.get("/api/cluster").json()["allocated"]["gpu"] == 0, what="an empty cluster")
    sevens = daemon.submit(tmp_path, "sevens", instances=12, gpu=7)
    two: str = ""
    try:
        daemon.wait_state(sevens, "RUNNING")
        hosts = viewer.get("/api/hosts").json()["hosts"]
        for h in hosts:
            used = [g for g in h["gpus"] if g["state"] == "used"]
            assert len(used) == 7 and {g["job"] for g in used} == {sevens}, h
        assert {g["state"] for h in hosts for g in h["gpus"]} == {"used", "free"}  # nobody waits: idle, not stranded
        two = daemon.submit(tmp_path, "two", instances=1, gpu=2)

        def stranded() -> dict[str, Any] | None:
            c = viewer.get("/api/cluster").json()
            return c if c["gpus"].get("stranded", 0) + c["gpus"].get("reserved", 0) == 12 else None

        c = wait_for(stranded, what="the free GPUs stranded")
        assert c["gpus"]["used"] == 84 and c["queued_gangs"] >= 1
        reserved = wait_for(lambda: [h for h in viewer.get("/api/hosts").json()["hosts"] if h["reserved_for"]],
                            timeout=60, what="a host kept for the waiting gang")
        assert [h["reserved_for"] for h in reserved] == [f"{two}/0"]
        assert [g["state"] for g in reserved[0]["gpus"]].count("reserved") == 1
        c = viewer.get("/api/cluster").json()
        assert (c["gpus"]["stranded"], c["gpus"]["reserved"]) == (11, 1)
        assert c["gang_states"].get("RUNNING", 0) >= 1 and sum(c["gang_states"].values()) >= 2
    finally:
        for j in (sevens, two):
            if j:
                admin.post(f"/api/jobs/{j}/stop")
        daemon.submit(tmp_path, "keeps-a-gpu")  # the tests after want a cluster in use (a gang of all 96 GPUs waits)


def test_drain_is_the_apis_a_viewers_is_refused_an_admins_shows_on_the_map(daemon: ConsoleDaemon) -> None:
    viewer, admin = logged_in(daemon, "victor"), logged_in(daemon, "alice")
    host = [h["hostname"] for h in viewer.get("/api/hosts").json()["hosts"] if not h["jobs"]][-1]  # ends drained
    a = viewer.post(f"/api/hosts/{host}/drain")
    assert a.status == 403 and "victor may not call DrainHost" in a.json()["error"]
    assert admin.post("/api/hosts/bad%20name/drain").json()["field"] == "host"
    assert admin.post(f"/api/hosts/{host}/drain", csrf=None).status == 403
    try:
        assert admin.post(f"/api/hosts/{host}/drain").json()["hostname"] == host
        drained = viewer.get("/api/hosts?status=drained").json()["hosts"]
        assert [h["hostname"] for h in drained] == [host] and drained[0]["gpus_used"] == 0
        assert [g["state"] for g in drained[0]["gpus"]] == ["drained"] * 8
        assert viewer.get("/api/cluster").json()["host_states"].get("drained") == 1
        assert admin.post(f"/api/hosts/{host}/undrain").json()["drain"] == ""
        # with a deadline (the CLI's --deadline), checked before anything is asked of the API
        assert admin.post(f"/api/hosts/{host}/drain?deadline=soon").json()["field"] == "deadline"
        assert admin.post(f"/api/hosts/{host}/drain?deadline=0s").json()["field"] == "deadline"
        assert admin.post(f"/api/hosts/{host}/drain?when=2h").json()["field"] == "when"
        assert viewer.get("/api/hosts?status=drained").json()["hosts"] == []  # none of those drained it
        before = time.time()
        r = admin.post(f"/api/hosts/{host}/drain?deadline=2h").json()
        assert r["drain"] == "drained" and before + 7190 < r["drain_deadline"] < time.time() + 7210, r
        shown = viewer.get("/api/hosts?status=drained").json()["hosts"]
        assert [h["drain_deadline"] for h in shown] == [r["drain_deadline"]]
    finally:
        assert admin.post(f"/api/hosts/{host}/undrain").json()["drain"] == ""
    assert any(e["method"].endswith("DrainHost") and not e["allowed"] for e in daemon.audit("victor"))


def test_the_pools_come_as_a_tree(daemon: ConsoleDaemon, tmp_path: Path) -> None:
    daemon.cli("pool", "create", "/teams", "--reservation", "gpu=8")
    daemon.cli("pool", "create", "/teams/a", "--reservation", "gpu=4")
    pools = {p["path"]: p for p in logged_in(daemon, "victor").get("/api/pools").json()["pools"]}
    assert pools["/teams/a"]["parent"] == "/teams" and pools["/teams"]["parent"] == "/" and pools["/"]["parent"] is None
    assert pools["/teams"]["reservation"]["gpu"] == 8 and pools["/teams"]["limit"] is None
    paths = list(pools)
    assert paths.index("/teams") < paths.index("/teams/a")
    # who lends to whom: /teams/a's gang of 6 GPUs is 2 beyond its reservation, lent by /teams/b's idle 4
    daemon.cli("pool", "create", "/teams/b", "--reservation", "gpu=4")
    job = daemon.create("name: borrower\ninstances: 1\nrespool: /teams/a\ntask: {command: train.py, "
                        "env: {PELOTON_SIM_DURATION: 600s}, resources: {cpu: 1, mem: 1Gi, gpu: 6}}\n", tmp_path)
    try:
        daemon.wait_state(job, "RUNNING")
        pools = {p["path"]: p for p in logged_in(daemon, "victor").get("/api/pools").json()["pools"]}
        assert pools["/teams/a"]["borrows_from"] == [{"pool": "/teams/b", "gpus": 2}], pools["/teams/a"]
        assert pools["/teams/a"]["borrows_unreserved"] == 0
        assert pools["/teams/b"]["lends_to"] == [{"pool": "/teams/a", "gpus": 2}]
        assert pools["/teams"]["borrows_from"] == [] and pools["/teams"]["lends_to"] == []  # within its 8
    finally:
        daemon.cli("job", "stop", job)


def _server(tmp: Path, *args: str) -> list[str]:
    return [*PELOTON, "server", "--listen", "127.0.0.1:0", "--data-dir", str(tmp / "data"), "--backend", "sim",
            "--sim-hosts", "2", "--metrics-listen", "", *args]


def test_a_console_other_machines_could_reach_or_a_taken_port_refuses_the_start(tmp_path: Path) -> None:
    r = subprocess.run(_server(tmp_path, "--ui-listen", "0.0.0.0:0"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--ui-listen: 0.0.0.0:0 can be reached from other machines" in r.stderr, r.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run(_server(tmp_path, "--ui-listen", f"127.0.0.1:{port}"), capture_output=True, text=True,
                           timeout=60)
    assert r.returncode == 1 and f"--ui-listen: cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr
    assert not (tmp_path / "data" / "daemon.addr").exists()  # refused before it served anything


def test_a_members_timeline_follows_its_states(daemon: ConsoleDaemon, tmp_path: Path) -> None:
    job = daemon.submit(tmp_path, "short", duration="1s")
    daemon.wait_state(job, "SUCCEEDED")
    b = logged_in(daemon, "victor")
    m = b.get(f"/api/jobs/{job}/members/0").json()
    states = [g["state"] for g in m["segments"]]
    assert states[0] == "PENDING" and states[-1] == "SUCCEEDED" and "RUNNING" in states, states
    assert all(g["end"] >= g["start"] for g in m["segments"]) and m["events_total"] == len(states)
    assert m["segments"][-1]["start"] == m["segments"][-1]["end"]  # ended: a point
    for path, field in ((f"/api/jobs/{job}/members/x", "instance"), ("/api/jobs/nope/members/0", "job")):
        a = b.get(path)
        assert a.status == 400 and a.json()["field"] == field
    assert b.get(f"/api/jobs/{job}/members/7").status == 404


def test_the_queue_lists_waiting_gangs_in_order_with_their_reason(daemon: ConsoleDaemon, tmp_path: Path) -> None:
    blocker = daemon.submit(tmp_path, "blocker", instances=12, gpu=8)  # a gang as big as the cluster: it waits
    behind = daemon.submit(tmp_path, "behind", instances=12, gpu=8)
    b = logged_in(daemon, "victor")
    try:
        q = wait_for(lambda: (lambda q: q if {g["job_id"] for g in q["gangs"]} >= {blocker, behind} else None)(
            b.get("/api/queue?pool=/").json()), what="both gangs queued")
        order = [g["job_id"] for g in q["gangs"]]
        assert order.index(blocker) < order.index(behind)
        mine = next(g for g in q["gangs"] if g["job_id"] == blocker)
        assert (mine["gang"], mine["members"], mine["resources"]["gpu"]) == (f"{blocker}/0", 12, 96)
        assert b.get("/api/queue?limit=1").json()["total"] >= 2 and len(b.get("/api/queue?limit=1").json()["gangs"]) == 1
        for query, field in (("limit=0", "limit"), ("pool=x", "pool"), ("order=desc", "order")):
            a = b.get(f"/api/queue?{query}")
            assert a.status == 400 and a.json()["field"] == field
    finally:
        admin = logged_in(daemon, "alice")
        for job in (blocker, behind):
            admin.post(f"/api/jobs/{job}/stop")


@dataclass
class ThreeHostDaemon(ConsoleDaemon):
    """Three hosts of 8 GPUs (and, as every ConsoleDaemon, a head-of-line gang probed for hosts after a second)."""

    def server_args(self) -> list[str]:
        args = super().server_args()
        args[args.index("--sim-hosts") + 1] = "3"
        return args


def test_the_queue_shows_the_hosts_a_head_of_line_gang_holds_and_when_they_free(tmp_path: Path) -> None:
    """A gang of two whole hosts, while one host runs a gang with max_runtime 300 s and another one without: the
    hosts kept for it are the free one and the timed one's, expected free at its start + 300 s (max_runtime);
    once nothing there has a max_runtime, its start is unknown. In the console's queue and `peloton queue`."""
    d = ThreeHostDaemon(tmp_path / "data", f"sqlite:///{tmp_path / 'peloton.db'}")
    timed_spec = ("name: timed\ninstances: 1\nsla: {max_runtime: 300s}\ntask: {command: x, env: "
                  "{PELOTON_SIM_DURATION: 600s}, resources: {cpu: 4, mem: 8Gi, gpu: 8}}\n")
    with serving(d):
        b = logged_in(d, "victor")
        timed = d.create(timed_spec, tmp_path)
        d.wait_state(timed, "RUNNING")
        untimed = d.submit(tmp_path, "untimed", gpu=8)
        d.wait_state(untimed, "RUNNING")
        hosts = {j: d.tasks(j)[0]["host"] for j in (timed, untimed)}
        started = min(e["time"] for e in b.get(f"/api/jobs/{timed}/events").json()["events"]
                      if e["state"] == "RUNNING")
        wide = d.submit(tmp_path, "wide", instances=2, gpu=8)

        def gang_of(job: str, basis: str) -> Any:
            return next((g for g in b.get("/api/queue").json()["gangs"]
                         if g["job_id"] == job and g["expected_start_basis"] == basis), None)

        g = wait_for(lambda: gang_of(wide, "max_runtime"), what="the wide gang's reservation with a start")
        assert len(g["reserved_hosts"]) == 2 and hosts[timed] in g["reserved_hosts"]
        assert hosts[untimed] not in g["reserved_hosts"] and g["reserved_hosts"] == sorted(g["reserved_hosts"])
        assert abs(g["expected_start"] - (started + 300)) < 15, (g["expected_start"], started)  # placed, then ran
        assert "expected to start in" in g["reason"]
        j = json.loads(d.cli("queue", "-o", "json").stdout)["gangs"]
        mine = next(x for x in j if x["job_id"] == wide)
        assert mine["reserved_hosts"] == g["reserved_hosts"] and mine["expected_start_basis"] == "max_runtime"
        assert mine["expected_start"].endswith("Z")  # a time, as every time of -o json
        table = d.cli("queue").stdout
        assert "RESERVED" in table.splitlines()[0] and "STARTS" in table.splitlines()[0]
        row = next(line for line in table.splitlines() if wide in line)
        assert " in 4m" in row or " in 5m" in row, row
        d.cli("job", "stop", timed)
        d.wait_state(wide, "RUNNING")  # the hosts held for it
        assert {t["host"] for t in d.tasks(wide)} == set(g["reserved_hosts"])
        wider = d.submit(tmp_path, "wider", instances=2, gpu=8)
        g = wait_for(lambda: gang_of(wider, "unknown"), what="a reservation whose start nothing bounds")
        assert g["expected_start"] is None and len(g["reserved_hosts"]) == 2
        row = next(line for line in d.cli("queue").stdout.splitlines() if wider in line)
        assert "unknown" in row, row


def test_a_job_page_has_its_events_a_gangs_timeline_and_its_logs(daemon: ConsoleDaemon, tmp_path: Path) -> None:
    """The job's state changes across its members (one ListTaskEvents), every member of a gang side by side, and
    a member's log read from an offset (as the page follows it) until its run has ended."""
    job = daemon.submit(tmp_path, "trio", instances=3, duration="1s")
    daemon.wait_state(job, "SUCCEEDED")
    viewer, admin = logged_in(daemon, "victor"), logged_in(daemon, "alice")
    ev = viewer.get(f"/api/jobs/{job}/events").json()
    assert ev["total"] == len(ev["events"]) and {e["instance"] for e in ev["events"]} == {0, 1, 2}
    assert [e["time"] for e in ev["events"]] == sorted((e["time"] for e in ev["events"]), reverse=True)
    assert ev["events"][0]["state"] == "SUCCEEDED" and "PENDING" in {e["state"] for e in ev["events"]}
    assert viewer.get(f"/api/jobs/{job}/events?limit=2").json()["events"] == ev["events"][:2]
    t = viewer.get(f"/api/jobs/{job}/gangs/0/timeline").json()
    assert [m["instance"] for m in t["members"]] == [0, 1, 2] and t["members_total"] == 3 and t["since"] is None
    for m in t["members"]:
        states = [s["state"] for s in m["segments"]]
        assert states[0] == "PENDING" and states[-1] == "SUCCEEDED" and "RUNNING" in states, states
    assert t["events_total"] == ev["total"]
    # logs: a viewer may not read another's (the API's rule); an admin reads the tail, then from the offset
    a = viewer.get(f"/api/jobs/{job}/members/0/logs")
    assert a.status == 403, a.body
    log = admin.get(f"/api/jobs/{job}/members/0/logs").json()
    assert log["ended"] and log["task_state"] == "SUCCEEDED" and log["content"] and log["task_id"] == f"{job}-0-1"
    more = admin.get(f"/api/jobs/{job}/members/0/logs?offset={log['next_offset']}").json()
    assert more["content"] == "" and more["next_offset"] == log["next_offset"] and more["ended"]
    # following a running member: its log grows until its run ends
    running = daemon.submit(tmp_path, "followed", duration="3s")
    daemon.wait_state(running, "RUNNING")
    first = admin.get(f"/api/jobs/{running}/members/0/logs").json()
    assert not first["ended"], first
    got, offset = first["content"], first["next_offset"]

    def follow() -> bool:
        nonlocal got, offset
        r = admin.get(f"/api/jobs/{running}/members/0/logs?offset={offset}").json()
        got, offset = got + r["content"], r["next_offset"]
        return bool(r["ended"] and not r["content"])

    wait_for(follow, what="the followed run's end")
    assert len(got) > len(first["content"]) and "SUCCEEDED" in got, got
    for path, field in ((f"/api/jobs/{job}/gangs/x/timeline", "gang"), (f"/api/jobs/{job}/events?limit=0", "limit"),
                        (f"/api/jobs/{job}/events?since=1", "since"),
                        (f"/api/jobs/{job}/members/0/logs?stream=metrics", "stream"),
                        (f"/api/jobs/{job}/members/0/logs?offset=-1", "offset"),
                        (f"/api/jobs/{job}/members/0/logs?tail=5", "tail"),
                        ("/api/jobs/nope/events", "job")):
        a = admin.get(path)
        assert a.status == 400 and a.json()["field"] == field, (path, a.body)
    a = admin.get(f"/api/jobs/{job}/gangs/4/timeline")
    assert a.status == 404 and a.json()["field"] == "gang"


def test_a_model_aware_jobs_page_has_its_plan_with_predicted_speed(daemon: ConsoleDaemon, tmp_path: Path) -> None:
    job = daemon.submit_model_aware(tmp_path, "planned")
    daemon.wait_state(job, "RUNNING")
    try:
        plan = logged_in(daemon, "victor").get(f"/api/jobs/{job}").json()["gangs"][0]["plan"]
        assert sum(plan["gpus_per_host"]) == 2 and plan["step_time"] > 0 and plan["samples_per_s"] > 0, plan
        assert plan["local_bsz"] == 8 and plan["measured_members"] == 0  # simulated members measure nothing
        assert all(a["samples_per_s"] > 0 for a in plan["alternatives"])
    finally:
        daemon.cli("job", "stop", job)


def test_delete_is_the_apis_for_an_ended_job(daemon: ConsoleDaemon, tmp_path: Path) -> None:
    job = daemon.submit(tmp_path, "to-delete", duration="1s")
    viewer, admin = logged_in(daemon, "victor"), logged_in(daemon, "alice")
    running = daemon.submit(tmp_path, "running")
    a = admin.post(f"/api/jobs/{running}/delete")
    assert a.status == 409 and a.json()["code"] == "FailedPrecondition", a.body  # the API: only an ended job
    daemon.wait_state(job, "SUCCEEDED")
    a = viewer.post(f"/api/jobs/{job}/delete")
    assert a.status == 403 and "victor may not call DeleteJob" in a.json()["error"]
    assert admin.post(f"/api/jobs/{job}/delete", csrf=None).status == 403
    assert admin.post(f"/api/jobs/{job}/delete").json() == {"deleted": job}
    assert admin.get(f"/api/jobs/{job}").status == 404


def test_the_audit_log_is_the_apis_for_whom_may_read_it(daemon: ConsoleDaemon, tmp_path: Path) -> None:
    job = daemon.submit(tmp_path, "audited")
    viewer, admin = logged_in(daemon, "victor"), logged_in(daemon, "alice")
    assert viewer.post(f"/api/jobs/{job}/stop").status == 403
    a = viewer.get("/api/audit")
    assert a.status == 403 and "victor may not call ListAuditEvents" in a.json()["error"]

    def refused() -> list[dict[str, Any]]:
        return [e for e in admin.get("/api/audit?principal=victor&denied=1").json()["events"]
                if e["object"] == job]

    events = wait_for(refused, what="the refused stop in the audit log")  # written in the background
    assert events[0]["method"].endswith("StopJob") and not events[0]["allowed"] and events[0]["via"] == "token"
    page = admin.get("/api/audit?limit=1").json()
    assert len(page["events"]) == 1 and page["before"] == page["events"][0]["id"]
    older = admin.get(f"/api/audit?limit=1&before={page['before']}").json()["events"]
    assert older and older[0]["id"] < page["before"]
    for query, field in (("denied=yes", "denied"), ("limit=0", "limit"), ("before=-1", "before"),
                         ("who=victor", "who")):
        r = admin.get(f"/api/audit?{query}")
        assert r.status == 400 and r.json()["field"] == field, query


def test_an_event_stream_ends_at_logout_and_once_its_token_is_revoked(daemon: ConsoleDaemon) -> None:
    """An open event stream was the API's WatchJobs authenticated once, at its start: after its token was revoked
    (removed from the principals file) or its session logged out, it went on delivering every job's changes for as
    long as the page stayed open. Logout ends it at once; a revoked token's within the API's bound (docs/ui.md)."""
    path = daemon.data_dir / "principals.json"
    token = add_token(path, "rita", ["viewer"])  # (the daemon reads the file again for a token it does not know)
    b = Browser(daemon.ui)
    assert b.login(token).status == 303
    stream = EventStream(http.client.HTTPConnection(b.host, b.port, timeout=15), b.cookie)
    other = EventStream(http.client.HTTPConnection(b.host, b.port, timeout=15), b.cookie)  # another tab's
    assert b.post("/logout").status == 303
    asked = time.monotonic()
    for s in (stream, other):
        assert s.until_closed(within=8) - asked < 2, "logout ends its event streams at once"
    # the same token logged in again (or still, in another browser), then revoked: its stream ends
    assert b.login(token).status == 303
    stream = EventStream(http.client.HTTPConnection(b.host, b.port, timeout=15), b.cookie)
    doc = json.loads(path.read_text())
    doc["principals"]["rita"]["tokens"] = []
    new = path.with_name("principals.json.new")
    new.write_text(json.dumps(doc))
    new.chmod(0o600)
    new.replace(path)
    revoked = time.monotonic()
    assert stream.until_closed(within=15) - revoked < 6 + 1.5  # (the API's bound, and a loaded machine's slack)
    failed = stream.failed()
    assert failed is not None and failed["code"] == "Unauthenticated", stream.lines[-6:]
    assert "the token is not known" in failed["error"]
    assert b.get("/api/events").status == 401  # the browser's reconnect: refused, and its page goes to the login
