"""The components' shared secret file: created owner-only by the serving process, refused when others can read
it, when it is missing for a process that only calls, or when it holds nothing."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from peloton.errors import FailedPrecondition
from peloton.security.component_auth import load_secret


def test_the_serving_process_creates_it_owner_only_once(tmp_path: Path) -> None:
    path = tmp_path / "internal.secret"
    first = load_secret(path, create=True)
    assert len(first) == 64 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_secret(path, create=True) == first  # not replaced
    assert load_secret(path, create=False) == first


@pytest.mark.parametrize(("content", "mode", "create", "error"), [
    (None, 0o600, False, "does not exist; give every process"),
    ("s" * 64, 0o644, False, "readable by others .mode 644.; chmod 600"),
    ("s" * 64, 0o640, True, "readable by others"),
    ("short", 0o600, False, "holds no secret"),
    ("\n", 0o600, True, "holds no secret"),
])
def test_unusable_files_are_refused_by_flag(tmp_path: Path, content: str | None, mode: int, create: bool,
                                            error: str) -> None:
    path = tmp_path / "internal.secret"
    if content is not None:
        path.write_text(content)
        path.chmod(mode)
    with pytest.raises(FailedPrecondition, match=error) as e:
        load_secret(path, create=create)
    assert e.value.message.startswith("--internal-secret-file: ")
