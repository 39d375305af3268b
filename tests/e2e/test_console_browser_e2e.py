"""The web console in a real headless Chromium (Debian's chromium and chromium-driver, driven by Selenium), against
the real daemon on the sim backend: each view loads without a console error, a job created through the API
appears and goes RUNNING without a reload, a viewer has no stop button and a forged stop is refused, every control
has a label and the pages work from the keyboard. Each view's screenshot is taken here; with
PELOTON_UI_SCREENSHOTS=DIR they are also written to DIR (docs/ui/ holds the committed ones: docs/ui.md)."""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import grpc
import pytest

from peloton.api.v1 import job_pb2, job_pb2_grpc
from peloton.security.identity import add_token
from tests.e2e.console import Browser, ConsoleDaemon, settled, wait_for
from tests.e2e.harness import Daemon, serving

pytestmark = pytest.mark.e2e
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the dev extra) drives the browser")
from selenium.common.exceptions import (  # noqa: E402
    ElementNotInteractableException,
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
SHOTS = os.environ.get("PELOTON_UI_SCREENSHOTS", "")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleDaemon]:
    tmp = tmp_path_factory.mktemp("console-browser")
    d = ConsoleDaemon(tmp / "data", f"sqlite:///{tmp / 'peloton.db'}")
    with serving(d):
        yield d


@pytest.fixture(scope="module")
def chrome() -> Iterator[Any]:
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("no chromium and chromedriver (Debian: apt-get install chromium chromium-driver; .ci/run does)")
    from selenium.webdriver.chrome.service import Service

    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,860",
              "--disable-background-networking", "--no-first-run"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=o, service=Service(DRIVER))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(chrome: Any, daemon: ConsoleDaemon) -> Iterator[Any]:
    """A fresh session (no cookie) and an empty console log for each test."""
    chrome.get(daemon.ui + "login")
    chrome.delete_all_cookies()
    chrome.get_log("browser")
    yield chrome


def wait(driver: Any, cond: Any, timeout: float = 20, what: str = "") -> Any:
    try:
        # (a live page re-renders what changed: an element found a moment ago may be gone, or not yet shown, and is
        # looked up again)
        return WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=[
            StaleElementReferenceException, ElementNotInteractableException]).until(settled(cond))
    except TimeoutException:
        raise AssertionError(f"timed out waiting for {what}; page: {driver.current_url}\n"
                             f"{driver.find_element(By.TAG_NAME, 'body').text[:2000]}\n"
                             f"console: {driver.get_log('browser')}") from None


def click(driver: Any, element_id: str, what: str) -> None:
    """Click the element of that id once it is there, in the same look (one found and clicked a moment later may
    have been re-rendered meanwhile: stale)."""
    def clicked(dr: Any) -> bool:
        found = dr.find_elements(By.ID, element_id)
        if not found:
            return False
        found[0].click()
        return True

    wait(driver, clicked, what=what)


def act(driver: Any, by: str, value: str, *keys: str) -> None:
    """Click the element (or type `keys` into it), looked up again until it takes: a live page may re-render it
    between the lookup and the action."""
    wait(driver, lambda dr: (dr.find_element(by, value).send_keys(*keys) if keys
                             else dr.find_element(by, value).click()) or True, what=f"{value} to act on")


def errors(driver: Any) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def shot(driver: Any, tmp: Path, name: str) -> None:
    path = tmp / f"{name}.png"
    assert driver.save_screenshot(str(path)) and path.stat().st_size > 1000
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(SHOTS) / path.name)


def log_in(driver: Any, d: ConsoleDaemon, who: str, tmp: Path | None = None) -> None:
    """Through the login form, from the keyboard: the token field has the focus, Enter submits."""
    driver.get(d.ui)
    wait(driver, lambda dr: dr.current_url.endswith("/login"), what="the login page")
    field = driver.switch_to.active_element
    assert field.get_attribute("id") == "token"
    if tmp is not None:
        shot(driver, tmp, "login")
    field.send_keys(d.tokens[who], Keys.ENTER)
    wait(driver, lambda dr: who in dr.find_element(By.ID, "who").text, what=f"{who} logged in")


def state_of(driver: Any, job: str) -> str:
    rows = driver.find_elements(By.CSS_SELECTOR, f'tr[data-job="{job}"] .state')
    return str(rows[0].text) if rows else ""


TIMED = """
name: resnet-ddp
instances: 4
sla: {max_runtime: 1h}
task: {command: train.py, env: {PELOTON_SIM_DURATION: 600s}, resources: {cpu: 4, mem: 8Gi, gpu: 4}}
"""


def unlabelled(driver: Any) -> list[str]:
    """The controls shown that have no label (a <label>, aria-label or text)."""
    return list(driver.execute_script("""
        return [...document.querySelectorAll("a, button, input, select, textarea")].filter((el) => !el.hidden)
          .filter((el) => !((el.labels && el.labels.length) || el.getAttribute("aria-label") ||
                            el.textContent.trim())).map((el) => el.outerHTML);
    """))


def test_each_view_loads_without_console_errors(browser: Any, daemon: ConsoleDaemon, tmp_path: Path) -> None:
    job = daemon.create(TIMED, tmp_path)  # with a max_runtime: the big gang's expected start is known
    daemon.submit(tmp_path, "finished", duration="1s")
    big = daemon.submit(tmp_path, "too-big-for-now", instances=12, gpu=8)  # waits: 12 hosts of 8, 16 GPUs in use
    try:
        daemon.wait_state(job, "RUNNING")
        log_in(browser, daemon, "alice", tmp_path)
        wait(browser, lambda dr: dr.find_elements(By.CSS_SELECTOR, "table[aria-label=Pools] tbody tr"),
             what="the cluster view")
        assert "Hosts" in browser.find_element(By.ID, "main").text
        shot(browser, tmp_path, "cluster")
        act(browser, By.LINK_TEXT, "Jobs")
        wait(browser, lambda dr: state_of(dr, big) == "PENDING" and state_of(dr, job) == "RUNNING", what="the jobs")
        # why it waits, from the queue (its position, then the placer's reason once a round has tried it): live
        # (then, after the settling window, that it waits for the hosts reserved for it)
        reason = wait(browser, lambda dr: (lambda t: t if "gang of 12 needs" in t or "reserved hosts" in t else None)(
            dr.find_element(By.CSS_SELECTOR, f'tr[data-job="{big}"] .reason').text), what="the waiting job's reason")
        assert reason.startswith("#1 in /, waiting "), reason
        shot(browser, tmp_path, "jobs")
        act(browser, By.LINK_TEXT, job)
        wait(browser, lambda dr: dr.find_elements(By.CSS_SELECTOR, "table[aria-label=Members] tbody tr"),
             what="the job page")
        members = wait(browser, lambda dr: [m.text for m in dr.find_elements(By.CSS_SELECTOR,
                                                                           "table[aria-label=Members] tbody tr")],
                       what="the members")
        assert len(members) == 4 and all("RUNNING" in m and "sim-" in m for m in members), members
        assert browser.find_elements(By.ID, "stop"), "an admin may stop the job"
        shot(browser, tmp_path, "job")
        # a member's timeline, opened from the keyboard
        act(browser, By.ID, "tl-1", Keys.ENTER)
        label = wait(browser, lambda dr: dr.find_element(By.CSS_SELECTOR, "#timeline-1 .timeline").get_attribute(
            "aria-label"), what="a timeline")
        assert label.startswith("Member 1: PENDING") and "RUNNING (run 1)" in label, label
        assert wait(browser, lambda dr: dr.find_element(By.ID, "tl-1").get_attribute("aria-expanded") == "true",
                    what="the timeline's button expanded")
        shot(browser, tmp_path, "job-timeline")
        act(browser, By.LINK_TEXT, "Queue")
        row = wait(browser, lambda dr: dr.find_element(By.CSS_SELECTOR, f'tr[data-gang="{big}/0"]').text, what="a row")
        assert row.startswith("/ 1 " + big), row  # pool, position, job
        # first in its pool and no hosts fit: every host is held for it (after the settling window, 1 s here), expected
        # free when resnet-ddp's max_runtime ends; the view re-reads on job changes, so it is asked again
        def held(dr: Any) -> tuple[str, str, str] | None:
            dr.get(daemon.ui + "queue")
            cells = wait(dr, lambda d2: d2.find_elements(By.CSS_SELECTOR, f'tr[data-gang="{big}/0"] td'), what="a row")
            got = (cells[9].text, cells[10].text, cells[11].text)
            return got if got[0] != "—" else None
        hosts, starts, why = wait(browser, held, timeout=40, what="the hosts held for the big gang")
        assert hosts.endswith("(12)") and "and 6 more" in hosts, hosts
        assert starts.startswith("in ") and "by the max_runtime of the gangs there" in starts, starts
        assert "waiting for reserved hosts" in why, why
        shot(browser, tmp_path, "queue")
        browser.get(daemon.ui + f"jobs/{big}")
        wait(browser, lambda dr: dr.find_elements(By.ID, "job-reason"), what="the waiting job's page")
        wait(browser, lambda dr: "reserved hosts" in dr.find_element(By.ID, "job-reason").text, what="why it waits")
        shot(browser, tmp_path, "job-waiting")
        assert errors(browser) == []
    finally:
        # a gang as big as the cluster at the head of the queue would soon preempt the other tests' jobs, and its
        # reservation would hold every host from them: stopped whatever happened above
        daemon.cli("job", "stop", big, check=False)


def test_a_job_page_has_its_events_a_gangs_timeline_its_plan_and_follows_a_log(browser: Any, daemon: ConsoleDaemon,
                                                                               tmp_path: Path) -> None:
    # logged in before the job starts, and its log followed first: the run need only outlast what comes before the
    # page follows (a run that ended first fails the test: the page then says "not following" and never "ended")
    log_in(browser, daemon, "alice")  # the logs: an admin's (a viewer reads only its own jobs' logs)
    job = daemon.submit(tmp_path, "three-of-a-gang", instances=3, gpu=1, duration="12s")
    daemon.wait_state(job, "RUNNING")
    browser.get(daemon.ui + f"jobs/{job}")
    rows = wait(browser, lambda dr: [r.text for r in dr.find_elements(By.CSS_SELECTOR,
                                                                      "table[aria-label=Events] tbody tr")],
                what="the job's events")
    # member 1's log, followed until its run ends (the page stops following then); from the keyboard

    def show_member_1(dr: Any) -> bool:
        member = dr.find_element(By.ID, "log-member")
        member.send_keys(Keys.CONTROL, "a")
        member.send_keys("1")
        dr.find_element(By.ID, "log-show").send_keys(Keys.ENTER)
        return True

    wait(browser, show_member_1, what="the log's member field and its Show button")
    wait(browser, lambda dr: "following" in dr.find_element(By.ID, "log-state").text
         and "RUNNING on" in dr.find_element(By.ID, "log-text").text, what="the log, followed")
    assert f"{job}-1-1" in browser.find_element(By.ID, "log-state").text
    assert any("RUNNING" in r for r in rows) and any("PENDING" in r for r in rows), rows
    assert "null" not in browser.find_element(By.ID, "main").text  # nothing absent written as text
    # every member of the gang side by side, opened from the keyboard, while the log is followed
    # (the live page re-renders as the members change: a button found may be replaced before the key reaches it)
    wait(browser, lambda dr: dr.find_element(By.ID, "gtl-0").send_keys(Keys.ENTER) or True, what="the button")
    bars = wait(browser, lambda dr: [b.get_attribute("aria-label") for b in
                                     dr.find_elements(By.CSS_SELECTOR, "#gang-timeline-0 .timeline")],
                what="the gang's timeline")
    assert [b.split(":")[0] for b in bars] == ["Member 0", "Member 1", "Member 2"], bars
    assert all("PENDING" in b and "RUNNING (run 1)" in b for b in bars), bars
    assert browser.find_element(By.ID, "gtl-0").get_attribute("aria-expanded") == "true"
    browser.execute_script("document.querySelector('table[aria-label=Gangs]').scrollIntoView()")
    shot(browser, tmp_path, "job-gang-timeline")
    text = wait(browser, lambda dr: (lambda t: t if "ended: not following" in dr.find_element(By.ID, "log-state").text
                                     else None)(dr.find_element(By.ID, "log-text").text), timeout=40,
                what="the run's end in the log, and following stopped")
    assert "SUCCEEDED" in text and text.count("RUNNING on") == 1, text
    assert browser.find_element(By.ID, "gtl-0").get_attribute("aria-expanded") == "true"  # kept across re-renders
    browser.execute_script("document.getElementById('log-text').scrollIntoView(false)")
    shot(browser, tmp_path, "job-logs")
    assert unlabelled(browser) == []
    # a model-aware job: the plan the cost model chose, its predicted speed, and the measured one (none: simulated)
    planned = daemon.submit_model_aware(tmp_path, "bert-like")
    try:
        browser.get(daemon.ui + f"jobs/{planned}")
        row = wait(browser, lambda dr: (lambda r: r[0].text if r else None)(
            dr.find_elements(By.CSS_SELECTOR, 'table[aria-label=Plans] tr[data-plan="0"]')), what="the plan")
        assert "not reported yet" in row, row  # simulated members measure nothing
        predicted = browser.find_elements(By.CSS_SELECTOR, 'tr[data-plan="0"] td')[3].text
        assert float(predicted) > 0, row
        shot(browser, tmp_path, "job-plan")
        # once the gang's run is over its members are no longer read: not "not reported yet" (they may have)
        daemon.cli("job", "stop", planned)
        row = wait(browser, lambda dr: (lambda r: r[0].text if r and "read only while the gang runs" in r[0].text
                                        else None)(
            dr.find_elements(By.CSS_SELECTOR, 'table[aria-label=Plans] tr[data-plan="0"]')), what="the ended plan")
        assert "not reported yet" not in row, row
    finally:
        daemon.cli("job", "stop", planned)
    assert errors(browser) == []


def test_a_job_created_through_the_api_appears_live_and_goes_running(browser: Any, daemon: ConsoleDaemon,
                                                                      tmp_path: Path) -> None:
    log_in(browser, daemon, "victor")
    browser.get(daemon.ui + "jobs")
    wait(browser, lambda dr: dr.find_elements(By.CSS_SELECTOR, "#jobs-body tr"), what="the jobs list")
    browser.execute_script("window.notReloaded = true")
    job = daemon.submit(tmp_path, "live", instances=2, gpu=2)
    wait(browser, lambda dr: state_of(dr, job) == "RUNNING", timeout=15, what="the new job RUNNING on the page")
    assert browser.execute_script("return window.notReloaded") is True  # the page was not loaded again
    assert errors(browser) == []


def test_an_admin_stops_a_job_from_its_page_and_sees_it_end(browser: Any, daemon: ConsoleDaemon,
                                                            tmp_path: Path) -> None:
    job = daemon.submit(tmp_path, "to-stop")
    daemon.wait_state(job, "RUNNING")
    log_in(browser, daemon, "alice")
    browser.get(daemon.ui + f"jobs/{job}")
    click(browser, "stop", "the stop button")
    browser.switch_to.alert.accept()
    wait(browser, lambda dr: "KILLED" in dr.find_element(By.ID, "job-state").text, what="the job KILLED")
    assert not browser.find_elements(By.ID, "stop")
    # the keyboard's focus on the job's state, across the page's re-renders (it fell to the document's start with
    # the button turned off, then gone: Tab went back to the skip link)
    assert browser.switch_to.active_element.get_attribute("id") == "job-state"
    # ended: it may be deleted, and is gone from the list
    click(browser, "delete", "the delete button")
    browser.switch_to.alert.accept()
    wait(browser, lambda dr: dr.current_url.endswith("/jobs") and dr.find_elements(By.CSS_SELECTOR, "#jobs-body tr"),
         what="back on the jobs list")
    assert not browser.find_elements(By.CSS_SELECTOR, f'tr[data-job="{job}"]')
    assert daemon.cli("job", "get", job, check=False).returncode != 0
    assert errors(browser) == []


def test_a_refresh_of_a_page_left_meanwhile_shows_no_error_over_the_page_now_shown(
        browser: Any, daemon: ConsoleDaemon, tmp_path: Path) -> None:
    """A job page's refresh still reading when its job is deleted and the page left: its 404 comes back after the jobs
    list is shown and must not replace it with "Something went wrong" (this raced in CI: the stop's late events
    refreshed the job page while its delete was on its way)."""
    job = daemon.submit(tmp_path, "left-meanwhile")
    daemon.wait_state(job, "RUNNING")
    log_in(browser, daemon, "alice")
    browser.get(daemon.ui + f"jobs/{job}")
    wait(browser, lambda dr: "RUNNING" in dr.find_element(By.ID, "job-state").text, what="the job page")
    # the page's reads of the job are held from here, each sent only when the test lets it go
    browser.execute_script("""
        window.__held = [];
        const real = window.fetch;
        window.fetch = (url, opts) => url === "/api/jobs/" + arguments[0]
            ? new Promise((done) => window.__held.push(() => done(real(url, opts)))) : real(url, opts);
    """, job)
    daemon.cli("job", "stop", job)  # a change on the job's watch: the page refreshes, its read held
    wait(browser, lambda dr: dr.execute_script("return window.__held.length") > 0, what="the refresh's read")
    daemon.wait_state(job, "KILLED")
    act(browser, By.LINK_TEXT, "← Jobs")
    wait(browser, lambda dr: dr.current_url.endswith("/jobs") and dr.find_elements(By.CSS_SELECTOR, "#jobs-body tr"),
         what="the jobs list")
    daemon.cli("job", "delete", job)
    browser.execute_script("window.__held.forEach((go) => go()); window.__held = [];")  # now answered: 404
    wait(browser, lambda dr: not dr.find_elements(By.CSS_SELECTOR, f'tr[data-job="{job}"]'), what="the job gone")
    browser.execute_script("return new Promise((done) => setTimeout(done, 500))")
    assert browser.find_elements(By.CSS_SELECTOR, "#jobs-body") and "Something went wrong" not in browser.find_element(
        By.TAG_NAME, "main").text
    assert [e for e in errors(browser) if "/api/jobs/" + job not in e["message"]] == []


def test_a_viewer_sees_no_stop_button_and_a_forged_stop_is_refused(browser: Any, daemon: ConsoleDaemon,
                                                                   tmp_path: Path) -> None:
    job = daemon.submit(tmp_path, "not-yours")
    daemon.wait_state(job, "RUNNING")
    log_in(browser, daemon, "victor")
    browser.get(daemon.ui + f"jobs/{job}")
    wait(browser, lambda dr: dr.find_elements(By.CSS_SELECTOR, "table[aria-label=Members] tbody tr"),
         what="the job page")
    assert browser.find_elements(By.ID, "stop") == []
    shot(browser, tmp_path, "job-viewer")
    assert errors(browser) == []
    # the request the button would send, forged from the viewer's own page with its own CSRF token
    status = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch("/api/session").then((r) => r.json()).then((s) => fetch("/api/jobs/" + arguments[0] + "/stop",
            {method: "POST", headers: {"X-CSRF-Token": s.csrf}})).then((r) => r.json().then((b) => done([r.status, b])));
    """, job)
    assert status[0] == 403 and "victor may not call StopJob" in status[1]["error"]
    assert daemon.state(job) == "RUNNING"
    assert any(e["method"].endswith("StopJob") and e["object"] == job and not e["allowed"]
               for e in daemon.audit("victor"))
    assert not browser.find_element(By.CSS_SELECTOR, 'nav a[data-view="audit"]').is_displayed()  # no audit.read
    # an admin finds the refusal in the console's audit log (the viewer's job page left first, as the `browser`
    # fixture leaves a test's page: a refresh of it answered after the cookie was gone logged a 401, under load)
    browser.get(daemon.ui + "login")
    browser.delete_all_cookies()
    log_in(browser, daemon, "alice")
    act(browser, By.LINK_TEXT, "Audit")
    wait(browser, lambda dr: dr.find_elements(By.ID, "a-principal"), what="the audit log")[0].send_keys("victor")
    act(browser, By.ID, "a-denied", "refused")
    browser.find_element(By.ID, "a-denied").submit()
    row = wait(browser, lambda dr: next((r.text for r in dr.find_elements(By.CSS_SELECTOR, "tr[data-audit]")
                                         if job in r.text), None), what="the refused stop in the audit log")
    assert "victor" in row and "StopJob" in row and "DENIED" in row, row
    shot(browser, tmp_path, "audit")
    assert [e for e in errors(browser) if "/stop" not in e["message"]] == []


def test_every_control_has_a_label_and_the_pages_work_from_the_keyboard(browser: Any, daemon: ConsoleDaemon) -> None:
    log_in(browser, daemon, "victor")
    for page in ("", "jobs", "queue", "pools", "hosts"):
        browser.get(daemon.ui + page)
        wait(browser, lambda dr: dr.find_elements(By.CSS_SELECTOR, "main table, main li.host"), what=f"/{page}")
        assert unlabelled(browser) == [], page
    # Tab from the top: the skip link first, then the views
    browser.get(daemon.ui)
    wait(browser, lambda dr: dr.find_elements(By.CSS_SELECTOR, "main table"), what="the cluster view")
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.TAB)
    order = []
    for _ in range(3):
        order.append(browser.switch_to.active_element.text)
        browser.switch_to.active_element.send_keys(Keys.TAB)
    assert order == ["Skip to content", "Cluster", "Jobs"], order
    # back to "Jobs" and Enter: the jobs view, as a click would
    browser.switch_to.active_element.send_keys(Keys.SHIFT, Keys.TAB)
    assert browser.switch_to.active_element.text == "Jobs"
    browser.switch_to.active_element.send_keys(Keys.ENTER)
    wait(browser, lambda dr: dr.find_elements(By.ID, "f-state"), what="the jobs view")
    # filter from the keyboard: choose a state, type a name, Enter submits
    select = browser.find_element(By.ID, "f-state")
    select.send_keys("RUNNING")
    name = browser.find_element(By.ID, "f-q")
    name.send_keys("live", Keys.ENTER)
    wait(browser, lambda dr: "state=RUNNING" in dr.current_url and "q=live" in dr.current_url,
         what="the filter in the address")
    assert errors(browser) == []


def empty_cluster(daemon: ConsoleDaemon) -> None:
    """Every job of the shared daemon stopped (by alice, an admin), and its GPUs free again."""
    api = Browser(daemon.ui)
    api.login(daemon.tokens["alice"])
    for state in ("RUNNING", "PENDING"):
        for j in api.get(f"/api/jobs?state={state}&page_size=500").json()["jobs"]:
            api.post(f"/api/jobs/{j['id']}/stop")
    wait_for(lambda: api.get("/api/cluster").json()["allocated"]["gpu"] == 0, what="an empty cluster")


def test_the_pools_tree_and_the_hosts_map_show_a_drained_host_and_stranded_and_reserved_gpus(
        browser: Any, daemon: ConsoleDaemon, tmp_path: Path) -> None:
    daemon.cli("pool", "create", "/research", "--reservation", "cpu=16,gpu=16", "--limit", "gpu=48")
    daemon.cli("pool", "create", "/research/vision", "--reservation", "gpu=8")
    # an empty cluster, one host drained, eleven members of 7 GPUs on the other eleven (one GPU free on each), then
    # a member of 2 GPUs that waits: the free GPUs are stranded, but on the host kept for it (reserved)
    empty_cluster(daemon)
    drained = sorted(h["hostname"] for h in json.loads(daemon.cli("host", "list", "-o", "json").stdout)["hosts"])[-1]
    daemon.cli("host", "drain", drained)  # without tasks: drained at once
    sevens = daemon.submit(tmp_path, "sevens", instances=11, gpu=7)
    daemon.wait_state(sevens, "RUNNING")
    two = daemon.submit(tmp_path, "two", instances=1, gpu=2)
    try:
        log_in(browser, daemon, "alice")
        act(browser, By.LINK_TEXT, "Pools")
        rows = wait(browser, lambda dr: [r.get_attribute("data-pool") for r in
                                         dr.find_elements(By.CSS_SELECTOR, "tr[data-pool]")], what="the pools")
        assert rows[:3] == ["/", "/research", "/research/vision"], rows  # parents before children
        cls = wait(browser, lambda dr: dr.find_element(By.CSS_SELECTOR, 'tr[data-pool="/research/vision"] td')
                   .get_attribute("class"), what="a pool's cell")
        assert "depth-2" in cls
        shot(browser, tmp_path, "pools")
        act(browser, By.LINK_TEXT, "Hosts")

        def drained_host(dr: Any) -> tuple[str, str, list[str]]:
            host = dr.find_element(By.CSS_SELECTOR, f'li[data-host="{drained}"]')
            return (host.get_attribute("class"), host.text,
                    [c.get_attribute("data-state") for c in host.find_elements(By.CSS_SELECTOR, ".gpu")])

        cls, text, cells = wait(browser, drained_host, what="the host map")
        assert "drained" in cls and "drained" in text and cells == ["drained"] * 8
        # the map re-reads on job changes (at most every 3 s) and every 5 s; the reservation comes after the gang's settling time
        wait(browser, lambda dr: dr.find_elements(By.CSS_SELECTOR, "li.host.up .gpu.reserved"), timeout=60,
             what="a GPU reserved for the waiting gang")
        reserved = browser.find_elements(By.CSS_SELECTOR, "li.host.up .gpu.reserved")
        stranded = browser.find_elements(By.CSS_SELECTOR, "li.host.up .gpu.stranded")
        assert (len(reserved), len(stranded)) == (1, 10)
        assert stranded[0].get_attribute("title").endswith(": free but stranded")
        kept = browser.find_element(By.CSS_SELECTOR, "li.host.up .reserved-for").text
        assert kept == f"kept for {two}/0", kept
        used = browser.find_elements(By.CSS_SELECTOR, "li.host.up .gpu.used")
        assert len(used) == 77 and all(u.get_attribute("data-job") == sevens for u in used)
        assert used[0].get_attribute("title").endswith(f": used by job {sevens}")
        label = browser.find_element(By.CSS_SELECTOR, f'li[data-host="{drained}"] .gpus').get_attribute("aria-label")
        assert label.startswith(f"{drained}: drained, 8 GPUs: 8 drained"), label
        shot(browser, tmp_path, "hosts")
        # the cluster view: GPUs and gangs by state, and the stage latencies
        act(browser, By.LINK_TEXT, "Cluster")
        gpus = wait(browser, lambda dr: dr.find_element(By.ID, "gpu-states").text, what="the GPUs by state")
        assert "used 77" in gpus and "free but stranded 10" in gpus and "reserved for a waiting gang 1" in gpus, gpus
        assert "RUNNING" in browser.find_element(By.ID, "gang-states").text
        run = browser.find_element(By.CSS_SELECTOR, 'tr[data-stage="submitted_to_running"]').text
        assert "none yet" not in run, run
        browser.execute_script("window.scrollTo(0, 0)")
        shot(browser, tmp_path, "cluster")
        act(browser, By.LINK_TEXT, "Hosts")
        wait(browser, lambda dr: dr.find_elements(By.ID, "h-status"), what="the host map")
        # filter from the keyboard: the status, Enter submits; the map shows the drained host alone
        act(browser, By.ID, "h-status", "drained")
        act(browser, By.ID, "h-q", Keys.ENTER)
        wait(browser, lambda dr: "status=drained" in dr.current_url and [
            h.get_attribute("data-host") for h in dr.find_elements(By.CSS_SELECTOR, "li.host")] == [drained],
            what="the drained host alone")
        # the admin puts it back in service from the map
        act(browser, By.CSS_SELECTOR, f'button[aria-label="Undrain {drained}"]')
        wait(browser, lambda dr: "No host matches." in dr.find_element(By.ID, "main").text, what="none drained")
        browser.get(daemon.ui + "hosts")
        wait(browser, lambda dr: "up" in dr.find_element(By.CSS_SELECTOR, f'li[data-host="{drained}"]')
             .get_attribute("class"), what="the host in service")
        assert daemon.cli("host", "list", "-o", "json").stdout.count('"drain": "drained"') == 0
        # and drains it again, with a deadline for the gangs there, answered in the dialog the button opens
        act(browser, By.CSS_SELECTOR, f'button[aria-label="Drain {drained}"]')
        wait(browser, lambda dr: dr.switch_to.alert, what="the drain's dialog").send_keys("2h")
        browser.switch_to.alert.accept()
        host = wait(browser, lambda dr: next((x for x in json.loads(daemon.cli("host", "list", "-o", "json").stdout)[
            "hosts"] if x["hostname"] == drained and x["drain"]), None), what="the host drained from the map")
        assert host["drain"] in ("draining", "drained") and host.get("drain_deadline"), host
        assert errors(browser) == []
    finally:
        daemon.cli("host", "undrain", drained)
        for j in (sevens, two):
            daemon.cli("job", "stop", j)


def test_the_hosts_map_shows_a_host_drained_by_someone_else_with_no_job_changing(
        browser: Any, daemon: ConsoleDaemon) -> None:
    """No API streams host changes, and the map was re-read on job changes only: a host drained (or failed) while
    no job changed stayed shown in service until one did. The view is read again every 5 s too."""
    empty_cluster(daemon)
    host = sorted(h["hostname"] for h in json.loads(daemon.cli("host", "list", "-o", "json").stdout)["hosts"])[0]
    log_in(browser, daemon, "alice")
    act(browser, By.LINK_TEXT, "Hosts")
    wait(browser, lambda dr: "up" in dr.find_element(By.CSS_SELECTOR, f'li[data-host="{host}"]').get_attribute("class"),
         what="the host in service")
    try:
        daemon.cli("host", "drain", host)  # by someone else, on a host without tasks: no job changes
        wait(browser, lambda dr: "drained" in dr.find_element(By.CSS_SELECTOR, f'li[data-host="{host}"]')
             .get_attribute("class"), timeout=30, what="the host drained, without a job change or a reload")
        assert errors(browser) == []
    finally:
        daemon.cli("host", "undrain", host)


def test_a_viewer_has_no_drain_button(browser: Any, daemon: ConsoleDaemon) -> None:
    log_in(browser, daemon, "victor")
    browser.get(daemon.ui + "hosts")
    wait(browser, lambda dr: dr.find_elements(By.CSS_SELECTOR, "li.host"), what="the host map")
    assert browser.find_elements(By.CSS_SELECTOR, "li.host button") == []
    assert errors(browser) == []


# ---- races between views, refreshes and live updates, made deterministic by holding the page's fetches

FETCHES = """
    // every fetch of the page is logged (its address, and whether it was answered); one matching a rule of hold()
    // is held: `early`, sent at once and answered when let go, else sent only when let go
    if (!window.__realFetch) {
      window.__realFetch = window.fetch;
      window.__rules = []; window.__held = []; window.__released = []; window.__log = [];
      window.fetch = (url, opts) => {
        const entry = { url: String(url), answered: false };
        window.__log.push(entry);
        const send = () => window.__realFetch(url, opts).finally(() => { entry.answered = true; });
        const rule = window.__rules.find((r) => r.on && r.match.test(entry.url));
        if (!rule) return send();
        const sent = rule.early ? send() : null;
        return new Promise((done) => window.__held.push(() => {
          const p = sent || send();
          window.__released.push(p);
          done(p);
        }));
      };
    }
    if (arguments[0]) window.__rules.push({ match: new RegExp(arguments[0]), early: arguments[1], on: true });
"""


def hold(driver: Any, pattern: str = "", early: bool = False) -> None:
    """Log the page's fetches from now on (until it is loaded again), and hold those of addresses matching
    `pattern` (a JavaScript regular expression)."""
    driver.execute_script(FETCHES, pattern, early)


def stop_holding(driver: Any) -> None:
    """Fetches made from now on are not held (those held still are, until let go)."""
    driver.execute_script("window.__rules.forEach((r) => { r.on = false; })")


def held(driver: Any, at_least: int = 1) -> int:
    return int(wait(driver, lambda dr: (lambda n: n if n >= at_least else None)(
        dr.execute_script("return window.__held.length")), what=f"{at_least} held fetches"))


def answered(driver: Any, pattern: str, at_least: int) -> None:
    """Until `at_least` fetches of addresses matching `pattern` were answered, and the page had a moment to act on
    the answers."""
    wait(driver, lambda dr: dr.execute_script(
        "return window.__log.filter((e) => e.answered && new RegExp(arguments[0]).test(e.url)).length",
        pattern) >= at_least, what=f"{at_least} answers to {pattern}")
    driver.execute_script("return new Promise((done) => setTimeout(done, 500))")


def let_go(driver: Any, newest_first: bool = False) -> None:
    """Let every fetch held so far go, and wait until each is answered and the page had a moment to act on the
    answers; fetches made later are still held."""
    driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const all = window.__held.splice(0);
        (arguments[0] ? all.reverse() : all).forEach((go) => go());
        Promise.allSettled(window.__released.splice(0)).then(() => setTimeout(done, 500));
    """, newest_first)


def test_a_view_left_while_it_loads_leaves_the_live_updates_to_the_view_now_shown(
        browser: Any, daemon: ConsoleDaemon, tmp_path: Path) -> None:
    """The cluster view's first read answered after the jobs list was shown: the cluster then opened its own event
    stream, closing the jobs list's (one stream a page), and the list no longer changed live."""
    log_in(browser, daemon, "victor")
    act(browser, By.LINK_TEXT, "Jobs")
    wait(browser, lambda dr: dr.find_elements(By.CSS_SELECTOR, "#jobs-body tr"), what="the jobs list")
    hold(browser, "^/api/cluster$")
    act(browser, By.LINK_TEXT, "Cluster")
    held(browser)
    browser.execute_script("window.__list = document.getElementById('jobs-body')")
    act(browser, By.LINK_TEXT, "Jobs")
    wait(browser, lambda dr: dr.execute_script(
        "const b = document.getElementById('jobs-body'); return b && b !== window.__list && b.rows.length > 0")
         and dr.find_element(By.ID, "status").text == "live", what="the jobs list again, live")
    let_go(browser)  # the cluster's read answers: that view was left
    job = daemon.submit(tmp_path, "shown-live")
    try:
        wait(browser, lambda dr: state_of(dr, job), timeout=15, what="the new job on the list, live")
        assert "Something went wrong" not in browser.find_element(By.ID, "main").text
        assert errors(browser) == []
    finally:
        daemon.cli("job", "stop", job, check=False)


def test_a_job_pages_refresh_answered_after_another_job_is_shown_draws_nothing_there(
        browser: Any, daemon: ConsoleDaemon, tmp_path: Path) -> None:
    """Job A's re-render (its member 1's timeline open) read A after job B's page was shown: its paint was skipped,
    but it went on to draw A's member 1's timeline under B's member 1, and marked B's button open."""
    a = daemon.submit(tmp_path, "job-a", instances=2)
    b = daemon.submit(tmp_path, "job-b", instances=2)
    try:
        daemon.wait_state(a, "RUNNING")
        daemon.wait_state(b, "RUNNING")
        log_in(browser, daemon, "alice")
        browser.get(daemon.ui + f"jobs/{a}")
        act(browser, By.ID, "tl-1")
        wait(browser, lambda dr: a in dr.find_element(By.ID, "timeline-1").text, what="A's member 1's timeline")
        hold(browser, f"^/api/jobs/{a}$")
        daemon.cli("job", "stop", a)  # a change on A's watch: its page re-renders, its read held
        held(browser)
        act(browser, By.LINK_TEXT, "← Jobs")
        act(browser, By.LINK_TEXT, b)
        # B's page, read twice: shown, then again on its watch's first message (a snapshot); steady from then on
        answered(browser, f"^/api/jobs/{b}$", 2)
        assert b in browser.find_element(By.TAG_NAME, "h1").text
        stop_holding(browser)
        let_go(browser)
        assert a not in browser.find_element(By.ID, "main").text
        assert browser.find_elements(By.ID, "timeline-1") == []
        assert browser.find_element(By.ID, "tl-1").get_attribute("aria-expanded") == "false"
        assert [e for e in errors(browser) if f"/api/jobs/{a}" not in e["message"]] == []
    finally:
        daemon.cli("job", "stop", a, b, check=False)


def test_a_log_shown_is_the_last_member_asked_for_whichever_read_answers_first(
        browser: Any, daemon: ConsoleDaemon, tmp_path: Path) -> None:
    """Show member 0's log, then member 1's: member 0's first read, answered last, wrote member 0's log into the
    panel that member 1's follow then went on appending to."""
    job = daemon.submit(tmp_path, "two-logs", instances=2)
    try:
        daemon.wait_state(job, "RUNNING")
        api = Browser(daemon.ui)
        api.login(daemon.tokens["alice"])
        logs = [api.get(f"/api/jobs/{job}/members/{i}/logs?stream=stdout").json()["content"] for i in (0, 1)]
        assert logs[0] and logs[1] and logs[0] != logs[1]
        log_in(browser, daemon, "alice")
        browser.get(daemon.ui + f"jobs/{job}")
        hold(browser, "/members/0/logs\\?stream=stdout$")
        act(browser, By.ID, "log-show")  # member 0 (the field's first value)
        held(browser)

        def show_member_1(dr: Any) -> bool:
            member = dr.find_element(By.ID, "log-member")
            member.send_keys(Keys.CONTROL, "a")
            member.send_keys("1")
            dr.find_element(By.ID, "log-show").click()
            return True

        wait(browser, show_member_1, what="the log's member field and its Show button")
        wait(browser, lambda dr: f"{job}-1-1" in dr.find_element(By.ID, "log-state").text
             and dr.find_element(By.ID, "log-text").text, what="member 1's log")
        let_go(browser)  # member 0's read answers now
        assert browser.find_element(By.ID, "log-text").text == logs[1].rstrip("\n")
        assert f"{job}-1-1" in browser.find_element(By.ID, "log-state").text
        assert errors(browser) == []
    finally:
        daemon.cli("job", "stop", job, check=False)


def test_the_jobs_list_shows_its_newest_read_whichever_answers_last(browser: Any, daemon: ConsoleDaemon,
                                                                   tmp_path: Path) -> None:
    """Two reads of the list in flight (a new job, then a stop): the older, answered last, put the stopped job
    back as RUNNING, and it stayed so until the next change."""
    job = daemon.submit(tmp_path, "stale-row")
    more: list[str] = []
    try:
        daemon.wait_state(job, "RUNNING")
        log_in(browser, daemon, "victor")
        browser.get(daemon.ui + "jobs")
        wait(browser, lambda dr: state_of(dr, job) == "RUNNING", what="the job RUNNING on the list")
        hold(browser, "^/api/jobs\\?", early=True)
        more.append(daemon.submit(tmp_path, "a-new-one"))  # the list is read again: that read held, job RUNNING
        held(browser)
        daemon.cli("job", "stop", job, check=False)
        daemon.wait_state(job, "KILLED")
        wait(browser, lambda dr: state_of(dr, job) == "KILLED", what="the job KILLED on the list, live")
        n = browser.execute_script("return window.__held.length")
        held(browser, n + 1)  # a read sent after the page saw KILLED
        let_go(browser, newest_first=True)
        assert state_of(browser, job) == "KILLED"
        assert errors(browser) == []
    finally:
        daemon.cli("job", "stop", job, *more, check=False)


def test_a_delete_answered_after_the_page_was_left_does_not_take_the_user_back_to_the_jobs(
        browser: Any, daemon: ConsoleDaemon, tmp_path: Path) -> None:
    job = daemon.submit(tmp_path, "deleted-late", duration="1s")
    daemon.wait_state(job, "SUCCEEDED")
    log_in(browser, daemon, "alice")
    browser.get(daemon.ui + f"jobs/{job}")
    hold(browser, f"^/api/jobs/{job}/delete$")
    click(browser, "delete", "the delete button")
    browser.switch_to.alert.accept()
    held(browser)
    act(browser, By.LINK_TEXT, "Hosts")
    wait(browser, lambda dr: dr.find_elements(By.CSS_SELECTOR, "li.host"), what="the hosts map")
    let_go(browser)
    assert browser.current_url.endswith("/hosts") and browser.find_elements(By.CSS_SELECTOR, "li.host")
    assert daemon.cli("job", "get", job, check=False).returncode != 0
    assert errors(browser) == []


def test_an_action_without_a_session_any_more_goes_to_the_login(browser: Any, daemon: ConsoleDaemon,
                                                               tmp_path: Path) -> None:
    """A session that ended meanwhile (expired, logged out in another tab): a click on Stop said "no session: log
    in first (/login)" in the status line and stayed; every read goes to the login then, and so does an action."""
    job = daemon.submit(tmp_path, "no-session")
    try:
        daemon.wait_state(job, "RUNNING")
        log_in(browser, daemon, "alice")
        browser.get(daemon.ui + "jobs")
        hold(browser)  # (nothing held: the page's reads are logged)
        act(browser, By.LINK_TEXT, job)
        answered(browser, f"^/api/jobs/{job}$", 2)  # shown, and again on its watch's snapshot: steady from then on
        browser.delete_all_cookies()
        click(browser, "stop", "the stop button")
        browser.switch_to.alert.accept()
        wait(browser, lambda dr: dr.current_url.endswith(f"/login?next=%2Fjobs%2F{job}"), what="the login page")
        assert daemon.state(job) == "RUNNING"
    finally:
        daemon.cli("job", "stop", job, check=False)


def test_a_hosts_filter_being_typed_survives_the_maps_refresh(browser: Any, daemon: ConsoleDaemon,
                                                             tmp_path: Path) -> None:
    """The map is drawn again on job changes (at most every 3 s): it drew its filters again too, so what was typed
    in them and not yet submitted was lost, and the keyboard's focus with it."""
    log_in(browser, daemon, "victor")
    act(browser, By.LINK_TEXT, "Hosts")
    wait(browser, lambda dr: dr.find_elements(By.CSS_SELECTOR, "li.host"), what="the hosts map")
    act(browser, By.ID, "h-q", "sim-0")
    browser.execute_script("window.__map = document.querySelector('.map')")
    job = daemon.submit(tmp_path, "redraws-the-map")
    try:
        wait(browser, lambda dr: dr.execute_script(
            "const m = document.querySelector('.map'); return m && m !== window.__map"), what="the map drawn again")
        assert browser.find_element(By.ID, "h-q").get_attribute("value") == "sim-0"
        assert browser.switch_to.active_element.get_attribute("id") == "h-q"
        assert errors(browser) == []
    finally:
        daemon.cli("job", "stop", job, check=False)


@dataclass
class FixedUiDaemon(ConsoleDaemon):
    """A console on a port of its own that stays the same across restarts (a page open in the browser reaches the
    restarted daemon's console at the same origin)."""

    ui_port: int = 0

    def server_args(self) -> list[str]:
        if not self.ui_port:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.ui_port = s.getsockname()[1]
        return [f"127.0.0.1:{self.ui_port}" if a == "127.0.0.1:0" else a for a in super().server_args()]


def test_actions_and_logout_work_on_a_page_left_open_across_a_daemon_restart(browser: Any, tmp_path: Path) -> None:
    """The CSRF token is an HMAC with a key the daemon makes at each start: a page open across a restart held the
    old one, so its every action was refused ("X-CSRF-Token: missing or wrong") until it was reloaded, and its
    Log out answered 403 without ending the session, while the page went to the login as if it had."""
    d = FixedUiDaemon(tmp_path / "data", f"sqlite:///{tmp_path / 'peloton.db'}")
    with serving(d):
        host = sorted(x["hostname"] for x in json.loads(d.cli("host", "list", "-o", "json").stdout)["hosts"])[0]
        log_in(browser, d, "alice")
        act(browser, By.LINK_TEXT, "Hosts")
        wait(browser, lambda dr: dr.find_elements(By.ID, f"drain-{host}"), what="the hosts map")
        d.stop()
        d.start(same_address=True)
        wait(browser, lambda dr: dr.find_element(By.ID, "status").text == "live", timeout=30,
             what="the page's event stream back")
        act(browser, By.ID, f"drain-{host}")
        wait(browser, lambda dr: dr.switch_to.alert, what="the drain's dialog").accept()
        wait(browser, lambda dr: dr.find_element(By.ID, "status").text != "live" or any(
            x["hostname"] == host and x["drain"] for x in json.loads(d.cli("host", "list", "-o", "json").stdout)[
                "hosts"]), what="the drain's answer")
        assert "CSRF" not in browser.find_element(By.ID, "status").text
        wait(browser, lambda dr: any(x["hostname"] == host and x["drain"] for x in json.loads(
            d.cli("host", "list", "-o", "json").stdout)["hosts"]), what="the host drained")
        d.stop()
        d.start(same_address=True)
        wait(browser, lambda dr: dr.find_element(By.ID, "status").text == "live", timeout=30,
             what="the page's event stream back")
        act(browser, By.ID, "logout")
        wait(browser, lambda dr: dr.current_url.endswith("/login"), what="the login page")
        browser.get(d.ui + "hosts")
        wait(browser, lambda dr: dr.current_url.endswith("/login?next=%2Fhosts"), what="logged out: the login again")


@dataclass
class ManyHostsDaemon(ConsoleDaemon):
    """450 hosts: three pages of the hosts map."""

    def server_args(self) -> list[str]:
        args = super().server_args()
        args[args.index("--sim-hosts") + 1] = "450"
        return args


def test_the_hosts_pages_follow_the_browsers_back_and_forward(browser: Any, tmp_path: Path) -> None:
    """The pages before the one shown (for Previous) were kept aside from the history: after Back the map said
    "page 3" on page 2, and Previous went to page 2 again."""
    d = ManyHostsDaemon(tmp_path / "data", f"sqlite:///{tmp_path / 'peloton.db'}")
    with serving(d):
        log_in(browser, d, "victor")
        act(browser, By.LINK_TEXT, "Hosts")

        def page(dr: Any) -> str:
            return str(dr.find_element(By.CSS_SELECTOR, ".pager .muted").text)

        wait(browser, lambda dr: page(dr) == "450 hosts, page 1 (200 shown)", what="page 1")
        first = browser.find_element(By.CSS_SELECTOR, "li.host").get_attribute("data-host")
        click(browser, "hosts-next", "Next")
        wait(browser, lambda dr: page(dr) == "450 hosts, page 2 (200 shown)", what="page 2")
        assert browser.switch_to.active_element.get_attribute("id") == "hosts-next"  # (the map drawn anew)
        second = browser.find_element(By.CSS_SELECTOR, "li.host").get_attribute("data-host")
        click(browser, "hosts-next", "Next")
        wait(browser, lambda dr: page(dr) == "450 hosts, page 3 (50 shown)", what="page 3")
        browser.back()
        wait(browser, lambda dr: browser.find_element(By.CSS_SELECTOR, "li.host").get_attribute("data-host") == second,
             what="page 2's hosts again")
        assert page(browser) == "450 hosts, page 2 (200 shown)"
        click(browser, "hosts-prev", "Previous")
        wait(browser, lambda dr: browser.find_element(By.CSS_SELECTOR, "li.host").get_attribute("data-host") == first,
             what="page 1's hosts")
        assert page(browser) == "450 hosts, page 1 (200 shown)" and "page_token" not in browser.current_url
        browser.back()  # (Previous went forward in the history: to page 2 again, as it was)
        wait(browser, lambda dr: page(dr) == "450 hosts, page 2 (200 shown)", what="page 2 by Back")
        assert errors(browser) == []


def test_a_link_from_another_site_opens_its_page_and_a_login_goes_back_to_it(browser: Any,
                                                                           daemon: ConsoleDaemon) -> None:
    """The session's cookie is SameSite=Strict, so a browser following a link from another site (a chat, a mail, a
    ticket) sends none: a user logged in got the login form for a link to a job, and once logged in again the
    cluster view, not the page linked to."""
    log_in(browser, daemon, "victor")
    browser.get(daemon.ui.replace("127.0.0.1", "localhost") + "login")  # another site: a name is not its address
    browser.execute_script("location.href = arguments[0]", daemon.ui + "queue?pool=/")
    wait(browser, lambda dr: unquote(dr.current_url) == daemon.ui + "queue?pool=/" and dr.find_elements(
        By.ID, "q-pool"), what="the queue, linked to")
    assert browser.find_element(By.ID, "q-pool").get_attribute("value") == "/"
    assert "victor" in browser.find_element(By.ID, "who").text
    # the login page goes back only to this console's own pages ("/\\host" is another site to a browser)
    other = daemon.ui.replace("127.0.0.1", "localhost").split("//")[1] + "jobs"
    browser.get(daemon.ui + "login?next=/%5C" + other)
    browser.execute_async_script("""const done = arguments[arguments.length - 1];
        fetch("/api/login").then(() => setTimeout(done, 500));""")
    assert browser.current_url.startswith(daemon.ui + "login"), browser.current_url
    # without a session: the login, then the page asked for
    browser.delete_all_cookies()
    browser.get(daemon.ui + "pools")
    wait(browser, lambda dr: "/login?next=" in dr.current_url, what="the login page")
    browser.find_element(By.ID, "token").send_keys(daemon.tokens["victor"], Keys.ENTER)
    wait(browser, lambda dr: dr.current_url == daemon.ui + "pools" and dr.find_elements(By.CSS_SELECTOR, "tr[data-pool]"),
         what="the pools, asked for before the login")
    assert errors(browser) == []


def test_a_filter_submitted_from_the_keyboard_keeps_the_focus_where_it_was(browser: Any, daemon: ConsoleDaemon) -> None:
    """A filter's Enter shows the view again, drawn anew: the focus fell to the document's start (a keyboard user
    pressing Tab next was taken back to the skip link), as it did after a page of the hosts map."""
    log_in(browser, daemon, "victor")
    for view, field, typed, path in (("Jobs", "f-q", "zz", "/jobs?q=zz"), ("Queue", "q-pool", "/", "/queue?pool=%2F"),
                                     ("Hosts", "h-q", "sim", "/hosts?q=sim")):
        act(browser, By.LINK_TEXT, view)
        wait(browser, lambda dr, f=field: dr.find_elements(By.ID, f), what=f"the {view} view")
        # the field typed in is marked: the view drawn anew has a field of that id without the mark
        browser.execute_script("document.getElementById(arguments[0]).dataset.typedIn = 'yes'", field)
        act(browser, By.ID, field, typed, Keys.ENTER)
        wait(browser, lambda dr, p=path: dr.current_url.endswith(p) and dr.find_elements(
            By.CSS_SELECTOR, "main table, main li.host"), what=f"the {view} view filtered")
        # the focus comes back once the view's first read is shown, which may be after its table is drawn (empty,
        # the read in flight: a loaded machine showed the gap)
        wait(browser, lambda dr, f=field: (lambda el: el.get_attribute("id") == f and el.get_attribute(
            "data-typed-in") is None)(dr.switch_to.active_element), what=f"the focus on {field}, the {view} view drawn anew")
    assert errors(browser) == []


def test_a_view_asked_for_while_the_daemon_restarts_comes_once_it_is_back(browser: Any, tmp_path: Path) -> None:
    """A view whose first read failed for want of the daemon (restarting: no answer, or 503) said "Something went
    wrong" for good: it had no event stream yet to bring it back, and the user had to think of reloading."""
    d = FixedUiDaemon(tmp_path / "data", f"sqlite:///{tmp_path / 'peloton.db'}")
    with serving(d):
        log_in(browser, d, "victor")
        wait(browser, lambda dr: dr.find_element(By.ID, "status").text == "live", what="the cluster view, live")
        d.stop()
        act(browser, By.LINK_TEXT, "Queue")
        wait(browser, lambda dr: "Something went wrong" in dr.find_element(By.ID, "main").text, what="the error")
        assert "retrying" in browser.find_element(By.CSS_SELECTOR, "main .error").text
        d.start(same_address=True)
        wait(browser, lambda dr: dr.find_elements(By.CSS_SELECTOR, "table[aria-label=Queue]") and dr.find_element(
            By.ID, "status").text == "live", timeout=40, what="the queue, once the daemon is back")
        assert browser.current_url.endswith("/queue")


def at_url(suffix: str) -> Any:
    """A wait's condition: the page's address ends with `suffix`. Asked while the page navigates there, the driver
    may answer an error ("aborted by navigation"): not there yet."""
    def there(dr: Any) -> bool:
        try:
            return bool(dr.current_url.endswith(suffix))
        except WebDriverException:
            return False

    return there


def _revoke(d: ConsoleDaemon, who: str) -> None:
    """Remove `who`'s tokens from the principals file (the way a token is revoked), as an editor would rewrite it."""
    path = d.data_dir / "principals.json"
    doc = json.loads(path.read_text())
    doc["principals"][who]["tokens"] = []
    new = path.with_name("principals.json.new")
    new.write_text(json.dumps(doc))
    new.chmod(0o600)
    new.replace(path)


def test_a_page_goes_to_the_login_once_its_token_is_revoked_or_logged_out_elsewhere(browser: Any,
                                                                                    daemon: ConsoleDaemon) -> None:
    """A page's event stream was authenticated once, when it opened: logged out in another tab, or its token
    revoked, the page went on showing every job's changes live for as long as it stayed open. Now its stream ends
    (at once at a logout; within the API's bound after a revocation) and the page goes to the login."""
    token = add_token(daemon.data_dir / "principals.json", "rosa", ["viewer"])
    daemon.tokens["rosa"] = token
    for how in ("logout elsewhere", "revoked"):
        log_in(browser, daemon, "rosa")
        act(browser, By.LINK_TEXT, "Jobs")
        wait(browser, lambda dr: dr.find_element(By.ID, "status").text == "live", what="the jobs list, live")
        if how == "revoked":
            _revoke(daemon, "rosa")
        else:  # another tab's Log out: the cookie gone from the browser, the logout sent with it
            other = Browser(daemon.ui)
            other.cookie = f"peloton_console={token}"
            browser.delete_all_cookies()
            assert other.post("/logout").status == 303
        wait(browser, at_url("/login?next=%2Fjobs"), timeout=20, what=f"the login ({how})")
        # (the browser logs the refused reads and reconnect: nothing else)
        assert [e for e in errors(browser) if "401" not in e["message"] and "text/event-stream" not in e["message"]] == []


@dataclass
class LocalUiDaemon(FixedUiDaemon):
    """The local backend (its tasks are adopted by the daemon restarted: their logs grow on meanwhile), with the
    console on a port of its own that stays the same across restarts."""

    def server_args(self) -> list[str]:
        args = super().server_args()
        return [*Daemon.server_args(self), "--ui-listen", args[args.index("--ui-listen") + 1]]


def test_a_log_followed_goes_on_after_a_daemon_restart(browser: Any, tmp_path: Path) -> None:
    """A log being followed stopped for good at the first read the daemon did not answer (restarting), saying "no
    answer from the console", though its member ran on and the page's event stream came back by itself."""
    d = LocalUiDaemon(tmp_path / "data", f"sqlite:///{tmp_path / 'peloton.db'}")
    with serving(d):
        job = d.create("name: talks\ninstances: 1\ntask: {command: 'i=0; while [ $i -lt 200 ]; do echo line $i; "
                       "i=$((i+1)); sleep 0.2; done', resources: {cpu: 0.5, mem: 64Mi}}\n", tmp_path)
        d.wait_state(job, "RUNNING")
        log_in(browser, d, "alice")
        browser.get(d.ui + f"jobs/{job}")
        act(browser, By.ID, "log-show")
        wait(browser, lambda dr: "following" in dr.find_element(By.ID, "log-state").text
             and "line 3" in dr.find_element(By.ID, "log-text").text, what="the log, followed")
        d.kill9()
        wait(browser, lambda dr: "retrying" in dr.find_element(By.ID, "log-state").text, what="the follow retrying")
        shown = browser.find_element(By.ID, "log-text").text.splitlines()
        d.start(same_address=True)
        wait(browser, lambda dr: len(dr.find_element(By.ID, "log-text").text.splitlines()) > len(shown) + 5
             and dr.find_element(By.ID, "log-state").text.endswith("following…"), timeout=40,
             what="the log followed again, once the daemon is back")
        lines = browser.find_element(By.ID, "log-text").text.splitlines()
        assert lines == [f"line {i}" for i in range(len(lines))], lines  # nothing lost, nothing twice
        d.cli("job", "stop", job)


def test_a_log_followed_stays_on_its_run_when_the_gang_restarts(browser: Any, tmp_path: Path) -> None:
    """A follow read "the member's current run" from the offset it had reached in the run it began on: once the
    gang restarted, it went on in the new run's log from the old run's offset (the new run's first lines never
    shown, the two runs' lines in one panel). It stays on its run, as `task logs -f` does, and says when it ended."""
    d = LocalUiDaemon(tmp_path / "data", f"sqlite:///{tmp_path / 'peloton.db'}")
    with serving(d):
        # member 0 talks; member 1 fails its first run after a while, so the gang (both) starts again as run 2
        job = d.create("name: restarts\ninstances: 2\ngang: {on_member_failure: restart_gang}\nretry: {max_attempts: 3}\n"
                       "task: {command: 'if [ $PELOTON_INSTANCE = 1 ]; then sleep 4; [ $PELOTON_ATTEMPT != 1 ] && "
                       "sleep 600; exit 1; fi; i=0; while [ $i -lt 600 ]; do echo run $PELOTON_ATTEMPT line $i; "
                       "i=$((i+1)); sleep 0.05; done', resources: {cpu: 0.5, mem: 64Mi}}\n", tmp_path)
        d.wait_state(job, "RUNNING")
        log_in(browser, d, "alice")
        browser.get(d.ui + f"jobs/{job}")
        act(browser, By.ID, "log-show")
        wait(browser, lambda dr: "following" in dr.find_element(By.ID, "log-state").text
             and "run 1 line 3" in dr.find_element(By.ID, "log-text").text, what="the log of run 1, followed")
        wait(browser, lambda dr: "ended: not following" in dr.find_element(By.ID, "log-state").text, timeout=40,
             what="the follow of run 1 ended with its run")
        assert f"{job}-0-1" in browser.find_element(By.ID, "log-state").text
        lines = browser.find_element(By.ID, "log-text").text.splitlines()
        assert lines and lines == [f"run 1 line {i}" for i in range(len(lines))], lines
        d.cli("job", "stop", job)


def test_a_background_refresh_answered_401_goes_to_the_login_without_an_error_on_the_way(
        browser: Any, daemon: ConsoleDaemon, tmp_path: Path) -> None:
    """The cluster view re-read on a job change without a session any more: "Something went wrong" was drawn over
    the view for the moment before the login page came (the read had sent the page to the login, then its error was
    shown as any other)."""
    log_in(browser, daemon, "victor")
    wait(browser, lambda dr: dr.find_element(By.ID, "status").text == "live", what="the cluster view, live")
    # what the page shows on its way out is kept where the login page can still read it (this tab's storage)
    browser.execute_script("""
        sessionStorage.removeItem("shown");
        new MutationObserver(() => {
          if (document.getElementById("main").textContent.includes("Something went wrong"))
            sessionStorage.setItem("shown", document.getElementById("main").textContent);
        }).observe(document.getElementById("main"), { childList: true, subtree: true, characterData: true });
    """)
    browser.delete_all_cookies()  # the session gone (expired, logged out in another tab); the stream stays open
    job = daemon.submit(tmp_path, "refreshes-the-cluster")
    try:
        wait(browser, at_url("/login?next=%2F"), what="the login page")
        assert browser.execute_script("return sessionStorage.getItem('shown')") is None
    finally:
        daemon.cli("job", "stop", job, check=False)


def test_the_jobs_pages_are_in_the_address_for_back_forward_and_reload(browser: Any, daemon: ConsoleDaemon) -> None:
    """The jobs list's page was kept aside from the address: a reload, Back or Forward showed the first page again
    (the hosts map's pages followed them)."""
    channel = grpc.insecure_channel(daemon.address)
    jobs = job_pb2_grpc.JobServiceStub(channel)
    md = (("authorization", f"Bearer {daemon.tokens['alice']}"),)
    ids = []
    for i in range(55):  # two pages of 50
        spec = job_pb2.JobSpec(name=f"paged-{i:02d}", instances=1)
        spec.task.command, spec.task.resources.cpu, spec.task.resources.mem = "train.py", 0.1, "64Mi"
        spec.task.env["PELOTON_SIM_DURATION"] = "1s"
        ids.append(jobs.CreateJob(job_pb2.CreateJobRequest(spec=spec), timeout=15, metadata=md).job_id)
    try:
        log_in(browser, daemon, "victor")
        browser.get(daemon.ui + "jobs?q=paged-")

        def page(dr: Any) -> list[str]:  # the pager's words and the first row's job, read together
            return list(dr.execute_script("""
                const count = document.querySelector(".pager .muted"), row = document.querySelector("#jobs-body tr[data-job]");
                return [count ? count.textContent : "", row ? row.dataset.job : ""];"""))

        first = wait(browser, lambda dr: (lambda p: p if p[0] == "page 1, 50 jobs" else None)(page(dr)), what="page 1")
        click(browser, "next", "Next")
        second = wait(browser, lambda dr: (lambda p: p if p[0] == "page 2, 5 jobs" else None)(page(dr)), what="page 2")
        assert "page_token=" in browser.current_url and "q=paged-" in browser.current_url
        browser.refresh()
        wait(browser, lambda dr: page(dr) == second, what="page 2 after a reload")
        browser.back()
        wait(browser, lambda dr: page(dr) == first, what="page 1 by Back")
        browser.forward()
        wait(browser, lambda dr: page(dr) == second, what="page 2 by Forward")
        click(browser, "prev", "Previous")
        wait(browser, lambda dr: page(dr) == first, what="page 1 by Previous")
        assert "page_token" not in browser.current_url and "q=paged-" in browser.current_url
        assert errors(browser) == []
    finally:
        for j in ids:  # (ended: a second each; out of the lists of the tests after this one)
            try:
                jobs.StopJob(job_pb2.StopJobRequest(job_id=j), timeout=15, metadata=md)
                jobs.DeleteJob(job_pb2.DeleteJobRequest(job_id=j), timeout=15, metadata=md)
            except grpc.RpcError:
                pass
        channel.close()
