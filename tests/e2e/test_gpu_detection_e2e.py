"""The local backend's one real host on a machine whose nvidia-smi is there but fails (a broken driver): the real
daemon, started with a fake nvidia-smi first on its PATH, says why its host has no GPUs where an operator looks, in
its log and in the host's labels (`host list`, `host get`). The store plays no part: SQLite only."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.harness import Daemon, serving

pytestmark = pytest.mark.e2e


@dataclass
class RealHostDaemon(Daemon):
    def server_args(self) -> list[str]:
        return ["--local-port-base", str(self.port_base)]  # the one real host: this machine, GPUs by nvidia-smi


def test_a_failing_nvidia_smi_is_in_the_log_and_on_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA "
                    "driver.'\nexit 9\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    with serving(RealHostDaemon(tmp_path / "data", f"sqlite:///{tmp_path}/peloton.db")) as d:
        (host,) = json.loads(d.cli("host", "list", "-o", "json").stdout)["hosts"]
        assert host["labels"]["gpu_error"] == "nvidia-smi exited with status 9", host["labels"]
        assert "gpu" not in host["capacity"] or host["capacity"]["gpu"] == 0, host["capacity"]
        assert "gpu_error=nvidia-smi exited with status 9" in d.cli("host", "get", host["hostname"]).stdout
        warning = next(line for line in d.log().splitlines() if "nvidia-smi exited with status 9" in line)
        assert "WARNING" in warning and str(fake) in warning and "could not communicate" in warning, warning
