"""The web console of a daemon whose API has TLS (with tokens, no client certificates), in a real headless Chromium
(Debian's chromium and chromium-driver, driven by Selenium): the console is HTTPS with the daemon's certificate,
which the browser is told to trust by its public key's hash (`--ignore-certificate-errors-spki-list`: a test CA
is not installed in the browser's store); a link of `peloton cluster ui-login` logs the daemon's user in once,
through the login page's script (the code is in the fragment, which only the page sees), and the same link a second
time is refused on the login page; a token logs in through the form over HTTPS. Client certificates in the browser
are not tested here (Chromium would need them in its NSS store): tests/e2e/test_console_auth_e2e.py tests them over
HTTP from the standard library."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from peloton.security.identity import add_token
from tests.e2e.console import ConsoleDaemon, settled
from tests.e2e.harness import PELOTON, serving

pytestmark = pytest.mark.e2e
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the dev extra) drives the browser")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@dataclass
class HttpsDaemon(ConsoleDaemon):
    certs: Path = Path()

    def server_args(self) -> list[str]:
        c = self.certs
        return [*super().server_args(), "--tls-cert", str(c / "server.pem"), "--tls-key", str(c / "server-key.pem")]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpsDaemon]:
    tmp = tmp_path_factory.mktemp("console-https")
    certs = tmp / "certs"
    assert subprocess.run([*PELOTON, "certs", "init", str(certs)], capture_output=True, timeout=60).returncode == 0
    data = tmp / "data"
    data.mkdir()
    tokens = {"alice": add_token(data / "principals.json", "alice", ["admin"])}
    d = HttpsDaemon(data, f"sqlite:///{tmp / 'peloton.db'}", certs=certs, tokens=tokens)
    with serving(d):
        yield d


@pytest.fixture(scope="module")
def browser(daemon: HttpsDaemon) -> Iterator[Any]:
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("no chromium and chromedriver (Debian: apt-get install chromium chromium-driver; .ci/run does)")
    from selenium.webdriver.chrome.service import Service

    cert = x509.load_pem_x509_certificate((daemon.certs / "server.pem").read_bytes())
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-background-networking",
              "--no-first-run",
              f"--ignore-certificate-errors-spki-list={base64.b64encode(hashlib.sha256(spki).digest()).decode()}"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=o, service=Service(DRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: Any, cond: Any, what: str) -> Any:
    try:
        return WebDriverWait(driver, 20, poll_frequency=0.1).until(settled(cond))
    except Exception:
        raise AssertionError(f"timed out waiting for {what}; page: {driver.current_url}\n"
                             f"{driver.find_element(By.TAG_NAME, 'body').text[:2000]}") from None


def errors(driver: Any) -> list[Any]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_a_one_time_link_logs_the_daemons_user_in_once(browser: Any, daemon: HttpsDaemon) -> None:
    assert daemon.ui.startswith("https://")
    url = daemon.cli("cluster", "ui-login").stdout.strip()
    browser.get(url)
    who = wait(browser, lambda dr: dr.find_element(By.ID, "who").text, what="the daemon's user logged in")
    assert "(admin)" in who and browser.current_url == daemon.ui, (who, browser.current_url)
    wait(browser, lambda dr: dr.find_elements(By.CSS_SELECTOR, "main table"), what="the cluster view")
    assert errors(browser) == []
    # the same link again: spent (and the fresh browser session has no cookie)
    browser.delete_all_cookies()
    browser.get(url)
    msg = wait(browser, lambda dr: dr.find_element(By.ID, "failed").text, what="the refusal")
    assert "used already" in msg and browser.current_url == daemon.ui + "login?failed=once", browser.current_url


def test_a_token_logs_in_over_https(browser: Any, daemon: HttpsDaemon) -> None:
    browser.delete_all_cookies()
    browser.get(daemon.ui)
    wait(browser, lambda dr: dr.current_url.endswith("/login"), what="the login page")
    browser.switch_to.active_element.send_keys(daemon.tokens["alice"], Keys.ENTER)
    wait(browser, lambda dr: "alice" in dr.find_element(By.ID, "who").text, what="alice logged in")
    cookie = browser.get_cookie("peloton_console")
    assert cookie is not None and cookie["secure"] and cookie["httpOnly"], cookie
