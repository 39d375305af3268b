"""The wheel carries the migrations: built from this checkout and installed in a fresh virtual environment, its
`peloton` command upgrades an empty database (SQLite and PostgreSQL) with nothing but the wheel's own files."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from peloton.store import db

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with the wheel of this checkout installed. Its dependencies come from this interpreter's
    site-packages through a path file (the tests run without the network); path files inside that folder are not
    read, so the checkout's editable install stays out of it."""
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w",
                            str(out / "dist"), str(ROOT)], check=True, capture_output=True, text=True, timeout=300)
    # the packaging metadata draws no setuptools deprecation banner (make run's install printed four of them)
    noise = [line for line in (built.stdout + built.stderr).splitlines() if "eprecat" in line]
    assert not noise, noise
    (wheel,) = (out / "dist").glob("peloton-*.whl")
    env = out / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, capture_output=True,
                   timeout=120)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "-q",
                    "--no-deps", str(wheel)], check=True, capture_output=True, timeout=300)
    purelib = _run(env, out, "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    (Path(purelib.stdout.strip()) / "_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    yield env


def _run(env: Path, cwd: Path, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PELOTON_") and k != "PYTHONPATH"}
    return subprocess.run([str(env / "bin" / command), *args], cwd=cwd, env=clean, capture_output=True, text=True,
                          timeout=120)


def test_the_installed_wheel_upgrades_an_empty_database(venv: Path, db_url: str) -> None:
    where = _run(venv, venv.parent, "python", "-c", "import peloton.store.db as d; print(d.MIGRATIONS_DIR)")
    assert where.returncode == 0, where.stderr
    site = Path(_run(venv, venv.parent, "python", "-c",
                     "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    assert Path(where.stdout.strip()) == (site / "peloton" / "migrations").resolve()  # the wheel's, not the checkout's
    r = _run(venv, venv.parent, "peloton", "db", "upgrade", "--db", db_url)  # the wheel's console script
    assert r.returncode == 0, r.stderr
    head = ScriptDirectory(str(db.MIGRATIONS_DIR)).get_current_head()  # the checkout's
    assert r.stdout.strip() == f"database at revision {head}"
    assert db.current_revision(db_url) == head


def test_the_installed_wheel_carries_the_web_consoles_pages(venv: Path) -> None:
    """docs/ui.md: nothing is fetched at run time, the pages are the wheel's own files."""
    r = _run(venv, venv.parent, "python", "-c",
             "import peloton.console.server as s; print(s.__file__); print(' '.join(sorted(s._assets())))")
    assert r.returncode == 0, r.stderr
    where, names = r.stdout.split("\n")[:2]
    assert not where.startswith(str(ROOT))  # the wheel's, not the checkout's
    shipped = sorted(p.name for p in (ROOT / "peloton" / "console" / "assets").iterdir())
    assert names.split() == shipped and "app.js" in shipped and "index.html" in shipped
