"""Rolling back a release (docs/running.md): `peloton db downgrade` under the store lock, an older release's refusal
of a newer schema, and the store as the older release finds it, then upgraded again by a daemon's start."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from sqlalchemy import text

from peloton.store import db
from tests.asroot import AS_ROOT_FLAGS
from tests.e2e.harness import PELOTON, Daemon, serving

HEAD = db.head_revision()
PREVIOUS = f"{int(HEAD) - 1:04d}"


def _db(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PELOTON, "db", *args], capture_output=True, text=True, timeout=120)


def _set_revision(url: str, revision: str) -> None:
    """What a newer release's migration leaves in the store, as far as an older release can tell."""
    engine = db.make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
    finally:
        engine.dispose()


def test_a_store_goes_back_a_revision_and_forward_again_with_its_pools_and_jobs(db_url: str, tmp_path: Path) -> None:
    d = Daemon(tmp_path / "data", db_url)
    with serving(d):
        d.cli("pool", "create", "/team")
        d.cli("pool", "create", "/team/vision")
        job = d.create("name: kept\nrespool: /team/vision\ninstances: 2\n"
                       "task: {command: 'true', resources: {cpu: 0.5, mem: 64Mi}}\n", tmp_path)
        r = _db("downgrade", PREVIOUS, "--db", db_url)
        assert r.returncode == 1, r
        assert r.stderr.startswith(f"peloton: error: another peloton daemon acts on {db.describe(db_url)}: pid "), r
        assert "stop it (and its standbys" in r.stderr
        assert db.current_revision(db_url) == HEAD  # nothing done

    r = _db("downgrade", PREVIOUS, "--db", db_url)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"database at revision {PREVIOUS}\n", "")
    r = _db("downgrade", HEAD, "--db", db_url)
    assert r.returncode == 1 and f"is at {PREVIOUS}, older than {HEAD}: `peloton db upgrade` goes forward" in r.stderr
    r = _db("downgrade", "base", "--db", db_url)
    assert r.returncode == 2 and "REVISION: one of 0001 to " in r.stderr and "drop the database" in r.stderr

    # a release newer than this one upgraded the store: this one says so, at `db upgrade` and at a daemon's start
    _set_revision(db_url, "9999")
    newer = (f"peloton: error: --db: {db.describe(db_url)} is at schema revision 9999, newer than this release's "
             f"newest ({HEAD}): a newer release upgraded it.")
    for r in (_db("upgrade", "--db", db_url), _db("downgrade", PREVIOUS, "--db", db_url)):
        assert r.returncode == 1 and r.stderr.startswith(newer), r
    p = subprocess.run([*PELOTON, "server", "--db", db_url, "--data-dir", str(tmp_path / "data"), "--listen",
                        "127.0.0.1:0", "--metrics-listen", "", *AS_ROOT_FLAGS, *d.server_args()],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and newer.removeprefix("peloton: error: ") in p.stderr, p.stderr[-2000:]

    # the older schema, as the older release would run on it; a start of this release upgrades it again
    _set_revision(db_url, PREVIOUS)
    with serving(Daemon(tmp_path / "data", db_url)) as again:
        assert db.current_revision(db_url) == HEAD
        assert again.job(job)["spec"]["respool"] == "/team/vision"
        assert [p["path"] for p in json.loads(again.cli("pool", "list", "-o", "json").stdout)["pools"]] == \
            ["/", "/team", "/team/vision"]
