"""The wheel carries the migrations: built from this checkout, installed apart from it, it upgrades an empty
database (SQLite and PostgreSQL) with nothing but its own files."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from peloton.store import db

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The wheel of this checkout, installed (without its dependencies, which this interpreter has) into a folder
    of its own."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(out / "dist"), str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = (out / "dist").glob("peloton-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(out / "site"),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    yield out


def _run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PELOTON_")}
    env["PYTHONPATH"] = str(site)  # before the checkout's editable install on sys.path
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_installed_wheel_upgrades_an_empty_database(installed: Path, db_url: str) -> None:
    site = installed / "site"
    where = _run(site, installed, "-c", "import peloton.store.db as d; print(d.MIGRATIONS_DIR)")
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()) == (site / "peloton" / "migrations").resolve()  # not the checkout's
    r = _run(site, installed, "-m", "peloton.cli.main", "db", "upgrade", "--db", db_url)
    assert r.returncode == 0, r.stderr
    head = ScriptDirectory(str(db.MIGRATIONS_DIR)).get_current_head()  # the checkout's
    assert r.stdout.strip() == f"database at revision {head}"
    assert db.current_revision(db_url) == head
