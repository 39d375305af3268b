"""TLS through the real daemon and the real CLI: `peloton certs init`, a daemon serving mutual TLS (and its
metrics over TLS), the CLI with its flags, its environment and a config context; clients without the right
credentials are turned away; an address other machines can reach is served without --insecure only so."""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.harness import PELOTON, Daemon

pytestmark = pytest.mark.e2e


class TlsDaemon(Daemon):
    certs: Path
    metrics_port: int = 0

    def server_args(self) -> list[str]:
        c = self.certs
        return [*super().server_args(), "--tls-cert", str(c / "server.pem"), "--tls-key", str(c / "server-key.pem"),
                "--tls-client-ca", str(c / "ca.pem"), "--metrics-tls"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PELOTON, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_mutual_tls_end_to_end(tmp_path: Path, db_url: str) -> None:
    certs = tmp_path / "certs"
    r = run("certs", "init", str(certs), "--name", "node-a.example.com", "--client", "alice")
    assert r.returncode == 0, r.stderr
    assert "--tls-client-ca" in r.stdout and (certs / "client-key.pem").exists()
    again = run("certs", "init", str(certs))
    assert again.returncode != 0 and "already holds" in again.stderr  # nothing replaced by mistake

    d = TlsDaemon(tmp_path / "data", db_url)
    d.certs = certs
    try:
        d.start()
        creds = ["--tls-ca", str(certs / "ca.pem"), "--client-cert", str(certs / "client.pem"),
                 "--client-key", str(certs / "client-key.pem")]
        spec = tmp_path / "job.yaml"
        spec.write_text('name: tls\ninstances: 2\ntask: {command: "echo over-tls", resources: {cpu: 1, mem: 64Mi}}\n')
        r = run("--address", d.address, *creds, "job", "create", "-f", str(spec))
        assert r.returncode == 0, r.stderr
        job = r.stdout.strip()
        assert run("--address", d.address, *creds, "job", "wait", job, "--timeout", "60").returncode == 0
        # the same through the environment, and through a context of the config file
        env = {"PELOTON_ADDRESS": d.address, "PELOTON_TLS_CA": str(certs / "ca.pem"),
               "PELOTON_CLIENT_CERT": str(certs / "client.pem"), "PELOTON_CLIENT_KEY": str(certs / "client-key.pem")}
        assert "over-tls" in run("task", "logs", job, "0", env=env).stdout
        config = tmp_path / "config.toml"
        config.write_text(f'current-context = "secure"\n[contexts.secure]\naddress = "{d.address}"\n'
                          f'tls-ca = "certs/ca.pem"\nclient-cert = "certs/client.pem"\n'
                          f'client-key = "certs/client-key.pem"\n')
        r = run("job", "get", job, env={"PELOTON_CONFIG": str(config)})
        assert r.returncode == 0 and "SUCCEEDED" in r.stdout, r.stderr
        # without a principals file a certificate of the CA makes its holder a submitter of its own jobs, never an
        # admin (who could allow root in a pool and run as root)
        info = run("--address", d.address, *creds, "cluster", "info").stdout
        assert "you:             alice (submitter; by certificate)" in info, info
        r = run("--address", d.address, *creds, "pool", "create", "/mine", "--allow-root")
        assert r.returncode != 0 and "alice may not call CreatePool" in r.stderr, r.stderr

        # turned away: plain text, TLS without a client certificate, a certificate of another CA
        other = tmp_path / "other"
        assert run("certs", "init", str(other), "--client", "mallory").returncode == 0
        for bad, hint in (([], "does the daemon use TLS"),
                          (["--tls-ca", str(certs / "ca.pem")], "client certificate"),
                          (["--tls-ca", str(certs / "ca.pem"), "--client-cert", str(other / "client.pem"),
                            "--client-key", str(other / "client-key.pem")], "cannot reach")):
            r = run("--address", d.address, *bad, "job", "list")
            assert r.returncode != 0 and hint in r.stderr, (bad, r.stderr)
    finally:
        d.stop()


def test_metrics_over_tls_and_a_public_address_without_insecure(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    assert run("certs", "init", str(certs)).returncode == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [*PELOTON, "server", "--listen", "0.0.0.0:0", "--data-dir", str(tmp_path / "data"), "--backend", "sim",
         "--metrics-listen", f"127.0.0.1:{port}", "--metrics-tls", "--tls-cert", str(certs / "server.pem"),
         "--tls-key", str(certs / "server-key.pem"), "--tls-client-ca", str(certs / "ca.pem")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "serving on" in line, proc.stderr.read() if proc.stderr else ""
        ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        ctx.load_cert_chain(str(certs / "client.pem"), str(certs / "client-key.pem"))
        body = urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx, timeout=10).read()
        assert b"peloton_" in body
        with pytest.raises(Exception):  # noqa: B017 - plain HTTP to a TLS port: refused one way or another
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    finally:
        proc.terminate()
        proc.wait(30)
    # TLS without client certificates is not enough to serve other machines
    r = subprocess.run([*PELOTON, "server", "--listen", "0.0.0.0:0", "--data-dir", str(tmp_path / "data2"),
                        "--backend", "sim", "--metrics-listen", "", "--tls-cert", str(certs / "server.pem"),
                        "--tls-key", str(certs / "server-key.pem")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--listen: 0.0.0.0:0 can be reached from other machines" in r.stderr


def test_tokens_over_tls_through_the_cli(tmp_path: Path) -> None:
    """TLS without client certificates plus tokens is authenticated: served to other machines without
    --insecure. `peloton token create` writes the principals file the daemon reads; the CLI sends the token."""
    certs = tmp_path / "certs"
    assert run("certs", "init", str(certs)).returncode == 0
    data = tmp_path / "data"
    r = run("token", "create", "ci-bot", "--role", "submitter", "--data-dir", str(data))
    assert r.returncode == 0 and "only its hash is kept" in r.stderr
    token = r.stdout.strip()
    proc = subprocess.Popen(
        [*PELOTON, "server", "--listen", "0.0.0.0:0", "--data-dir", str(data), "--backend", "sim", "--metrics-listen",
         "", "--unix-socket", "", "--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server-key.pem")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "serving on" in line, proc.stderr.read() if proc.stderr else ""
        address = line.split("serving on ")[1].split()[0]
        env = {"PELOTON_ADDRESS": address, "PELOTON_TLS_CA": str(certs / "ca.pem")}
        denied = run("job", "list", env=env)
        assert denied.returncode != 0 and "no credentials" in denied.stderr
        spec = tmp_path / "job.yaml"
        spec.write_text('name: bot\ninstances: 1\ntask: {command: "train.py", resources: {cpu: 1, mem: 64Mi}}\n')
        created = run("job", "create", "-f", str(spec), env={**env, "PELOTON_TOKEN": token})
        assert created.returncode == 0, created.stderr
        info = run("cluster", "info", env={**env, "PELOTON_TOKEN": token}).stdout
        for line in ("TLS:             on", "authentication:  tokens", "you:             ci-bot (submitter; by token)"):
            assert line in info.splitlines(), info
        assert "INSECURE" not in info
        shown = run("job", "get", created.stdout.strip(), "-o", "json", env={**env, "PELOTON_TOKEN": token})
        assert '"owner": "ci-bot"' in shown.stdout
        refused = run("pool", "create", "/bots", env={**env, "PELOTON_TOKEN": token})
        assert refused.returncode != 0 and "ci-bot may not call CreatePool" in refused.stderr
        admin = run("token", "create", "root", "--role", "admin", "--data-dir", str(data)).stdout.strip()
        audit = run("audit", "--since", "5m", env={**env, "PELOTON_TOKEN": admin})
        assert audit.returncode == 0, audit.stderr
        lines = audit.stdout.splitlines()
        assert any("ci-bot" in ln and "CreateJob" in ln and "allowed" in ln for ln in lines), audit.stdout
        assert any("ci-bot" in ln and "CreatePool" in ln and "DENIED" in ln for ln in lines), audit.stdout
        events = json.loads(run("audit", "-o", "json", env={**env, "PELOTON_TOKEN": admin}).stdout)["events"]
        assert all(isinstance(e["id"], int) and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", e["at"])
                   for e in events) and events, events  # docs/cli.md#json-output
        # `token list` names each token by an id (what `token create` said), `token revoke` takes it: the daemon
        # refuses the token within a second, and the principal's other token goes on working
        second = run("token", "create", "ci-bot", "--data-dir", str(data))
        first_id = re.search(r"token ([0-9a-f]{12}) for ci-bot", r.stderr).group(1)  # type: ignore[union-attr]
        second_id = re.search(r"token ([0-9a-f]{12}) for ci-bot", second.stderr).group(1)  # type: ignore[union-attr]
        listed = run("token", "list", "--data-dir", str(data)).stdout.splitlines()
        assert listed[0].split() == ["NAME", "ROLES", "USER", "TOKENS"]
        assert [ln.split() for ln in listed[1:]] == [["ci-bot", "submitter", "-", first_id, second_id],
                                                     ["root", "admin", "-", listed[2].split()[3]]]
        revoked = run("token", "revoke", "ci-bot", "--id", first_id[:6], "--data-dir", str(data))
        assert revoked.returncode == 0 and f"revoked 1 token(s) of ci-bot in {data}/principals.json: {first_id}" \
            in revoked.stderr
        deadline = time.monotonic() + 10
        while (gone := run("job", "list", env={**env, "PELOTON_TOKEN": token})).returncode == 0:
            assert time.monotonic() < deadline, "the revoked token still works"
            time.sleep(0.2)
        assert "the token is not known to this daemon" in gone.stderr, gone.stderr
        assert run("job", "list", env={**env, "PELOTON_TOKEN": second.stdout.strip()}).returncode == 0
    finally:
        proc.terminate()
        proc.wait(30)


def test_an_insecure_daemon_says_so_in_its_log_and_in_cluster_info(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*PELOTON, "server", "--listen", "0.0.0.0:0", "--insecure", "--data-dir", str(tmp_path / "data"), "--backend",
         "sim", "--metrics-listen", "", "--unix-socket", ""], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "serving on" in line, proc.stderr.read() if proc.stderr else ""
        address = line.split("serving on ")[1].split()[0]
        info = run("cluster", "info", env={"PELOTON_ADDRESS": address})
        assert info.returncode == 0, info.stderr
        assert ("INSECURE (--insecure): --listen 0.0.0.0:0 is reachable from other machines without TLS or "
                "authentication") in info.stdout
        assert "authentication:  off: every caller is an admin" in info.stdout
        as_json = run("cluster", "info", "-o", "json", env={"PELOTON_ADDRESS": address}).stdout
        assert '"insecure": true' in as_json and '"backend": "sim"' in as_json
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "INSECURE (--insecure): --listen 0.0.0.0:0" in err
