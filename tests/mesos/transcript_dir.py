"""Where the recordings of a real Mesos master (the conformance transcripts) are, for every test that reads them.

Looked up in this order:

1. ``$MESOS_TRANSCRIPTS``, when set (an explicit override: it must hold the recordings, or the tests fail);
2. ``tests/mesos/transcripts/`` in this repository: the copy versioned with the tests, used normally;
3. ``<checkout>/../shared/mesos-transcripts``: the folder the recordings come from, beside the checkout (only
   found when the in-repository copy is missing).

When none holds the recordings the tests that need them FAIL (never skip): a test that silently stops checking
the protocol against the real master is worse than a red one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

ENV = "MESOS_TRANSCRIPTS"
IN_REPO = Path(__file__).resolve().parent / "transcripts"
CHECKOUT = Path(__file__).resolve().parents[2]
BESIDE_CHECKOUT = CHECKOUT.parent / "shared" / "mesos-transcripts"
PATTERN = "[0-9][0-9]-*.json"


def _holds_recordings(d: Path) -> bool:
    return d.is_dir() and any(d.glob(PATTERN))


def find() -> tuple[Path | None, str]:
    """(the first candidate folder that holds recordings, "") or (None, where it looked and why it failed)."""
    env = os.environ.get(ENV)
    if env:
        d = Path(env)
        if _holds_recordings(d):
            return d, ""
        return None, f"${ENV}={env} holds no {PATTERN} recordings"
    for d in (IN_REPO, BESIDE_CHECKOUT):
        if _holds_recordings(d):
            return d, ""
    return None, f"no {PATTERN} recordings in {IN_REPO} nor in {BESIDE_CHECKOUT}, and ${ENV} is not set"


def transcripts_dir() -> Path:
    """The folder of the recordings; fails the calling test, with where it looked, when there is none."""
    d, why = find()
    if d is None:
        pytest.fail(f"Mesos transcripts not found: {why} (restore tests/mesos/transcripts/ from git, or point "
                    f"${ENV} at a folder of recordings)", pytrace=False)
    return d


def transcript_files() -> list[Path]:
    """Every recording (NN-*.json), sorted; fails the calling test when there are none."""
    return sorted(transcripts_dir().glob(PATTERN))


def transcript_path(name: str) -> Path:
    """One recording by file name; fails the calling test when it is missing."""
    p = transcripts_dir() / name
    if not p.is_file():
        pytest.fail(f"Mesos transcript {name} is missing from {p.parent}", pytrace=False)
    return p


def load_transcript(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(transcript_path(name).read_text())
    return data


def parametrize_files() -> list[Any]:
    """For @pytest.mark.parametrize at collection time: the recordings, or, when there are none, one parameter
    ``None`` that the test passes to `require()`, which fails it with the reason (an empty parameter list would
    make pytest skip the test)."""
    d, _ = find()
    files = sorted(d.glob(PATTERN)) if d is not None else []
    return [pytest.param(p, id=p.stem) for p in files] or [pytest.param(None, id="transcripts-missing")]


def require(path: Path | None) -> Path:
    """A parameter from `parametrize_files()`: the recording, or (None) fail the test saying why there is none."""
    if path is None:
        transcripts_dir()
        pytest.fail("Mesos transcripts not found at collection time", pytrace=False)
    return path
