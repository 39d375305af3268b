"""The public profiles the model-aware tests read: ../shared/data/public beside the checkout (see its SOURCES.md).

They are never copied into the repository. Only bert and cifar10 are there: the Pollux artifact's other
applications are held out to evaluate the cost model, and nothing is fitted to them."""

from __future__ import annotations

import functools
from pathlib import Path

from peloton.modelaware.cost import Reference
from peloton.modelaware.profile import ProfileRow, read_profile
from peloton.replay.work import SpeedModel, speed_models
from tests.public_data import require

PUBLIC = require()
TRACES = PUBLIC / "adaptdl" / "traces"
# the measurement cluster: 16 hosts x 4 NVIDIA T4 (PCIe), 50 Gb/s between hosts (SOURCES.md)
REFERENCE = Reference("t4", 50, "pcie")
# the small profile: what a user would measure before fitting
SMALL = {(1,), (4,), (1, 1), (1, 1, 1, 1), (4, 4), (4, 4, 4, 4)}


def profile_path(app: str) -> Path:
    path = TRACES / app / "placements.csv"
    assert path.is_file(), f"{path}: the public profiles are not beside the checkout (../shared/data/public)"
    return path


def profile(app: str) -> list[ProfileRow]:
    path = profile_path(app)
    return read_profile(path.read_text(), source=str(path))


def public_speed_models() -> dict[str, SpeedModel]:
    """The replay's speed model of every application, bert and cifar10 fitted to their public profiles: what
    `speed_models` makes of them (a copy of the dict, each model frozen), fitted once per test process (~7 s of CPU
    each; test_replay_work.py and test_replay_policies.py both read them)."""
    return dict(_public_speed_models())


@functools.cache
def _public_speed_models() -> dict[str, SpeedModel]:
    return speed_models({a: (profile_path(a).read_text(), a) for a in ("bert", "cifar10")})
