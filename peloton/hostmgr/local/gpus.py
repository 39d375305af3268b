"""What the machine the local backend runs on has: GPUs (via nvidia-smi), cores, memory and disk."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from peloton.domain.resources import Resources
from peloton.modelaware.gpus import BUILTIN
from peloton.modelaware.hostlabels import GPU_ERROR

log = logging.getLogger(__name__)

_NVIDIA_SMI_TIMEOUT_S = 10.0


def parse_nvidia_smi_indices(text: str) -> list[int]:
    """Output of `nvidia-smi --query-gpu=index --format=csv,noheader` -> sorted GPU indices.

    Lines that are not integers (warnings, blanks) are skipped."""
    out: set[int] = set()
    for line in text.splitlines():
        field = line.split(",", 1)[0].strip()
        if not field:
            continue
        try:
            idx = int(field)
        except ValueError:
            continue
        if idx >= 0:
            out.add(idx)
    return sorted(out)


@dataclass(frozen=True, slots=True)
class _Answer:
    """What running nvidia-smi gave: its output, or why there is none to read (`problem`, one short line, and
    `detail`, what it printed)."""
    stdout: str = ""
    problem: str = ""
    detail: str = ""


def _excerpt(text: str, limit: int = 500) -> str:
    """`text` on one line of printable characters, at most `limit` of them."""
    line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return line if len(line) <= limit else line[:limit] + "..."


def _nvidia_smi(exe: str, query: str) -> _Answer:
    """Run nvidia-smi for `query`, in a session of its own: when it does not answer in time, it and whatever it
    started are killed."""
    try:
        proc = subprocess.Popen([exe, f"--query-gpu={query}", "--format=csv,noheader"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        return _Answer(problem="nvidia-smi could not be run", detail=e.strerror or str(e))
    try:
        out, err = proc.communicate(timeout=_NVIDIA_SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return _Answer(problem=f"nvidia-smi did not answer within {_NVIDIA_SMI_TIMEOUT_S:g} s", detail="killed")
    stdout = out.decode("utf-8", "replace")
    said = _excerpt(err.decode("utf-8", "replace")) or _excerpt(stdout)  # it prints most of its errors to stdout
    said = said or "printed nothing"
    if proc.returncode < 0:
        with contextlib.suppress(ValueError):
            said = f"{signal.Signals(-proc.returncode).name}; {said}"
        return _Answer(problem=f"nvidia-smi was killed by signal {-proc.returncode}", detail=said)
    if proc.returncode != 0:
        return _Answer(problem=f"nvidia-smi exited with status {proc.returncode}", detail=said)
    return _Answer(stdout=stdout, detail=said)


def detect_gpus() -> list[int]:
    """Indices of the NVIDIA GPUs on this machine; [] when there is no nvidia-smi or it fails."""
    return detect().indices


@dataclass(frozen=True, slots=True)
class Detected:
    """What nvidia-smi says of this machine's GPUs."""
    indices: list[int]
    gpu_model: str | None  # the GPU table's name for every GPU's model; None: none, unknown or mixed
    # Why an nvidia-smi that is there gave no GPU (it failed, did not answer, or listed none), on one short line: the
    # hosts' GPU_ERROR label. "" when it listed some, or when there is no nvidia-smi (no GPUs expected).
    problem: str = ""


def detect() -> Detected:
    """This machine's GPUs and their model, in one call of nvidia-smi. An nvidia-smi that is there but gives no GPU
    is a warning, with what it said: on a GPU machine whose driver is broken, the hosts have no GPUs, and this says
    why. No nvidia-smi at all is quiet."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return Detected([], None)
    answer = _nvidia_smi(exe, "index,name")
    indices = parse_nvidia_smi_indices(answer.stdout)
    if indices:
        return Detected(indices, gpu_model_of(parse_nvidia_smi_names(answer.stdout)))
    problem = answer.problem or "nvidia-smi listed no GPU"
    log.warning("%s (%s): %s; this machine's hosts have no GPUs (host label %s, docs/running.md#local-backend)",
                problem, exe, answer.detail, GPU_ERROR)
    return Detected([], None, problem)


def parse_nvidia_smi_names(text: str) -> list[str]:
    """Output of `nvidia-smi --query-gpu=index,name --format=csv,noheader` -> the name of each GPU listed."""
    out = []
    for line in text.splitlines():
        idx, _, name = line.partition(",")
        if idx.strip().isdigit() and name.strip():
            out.append(name.strip())
    return out


def gpu_model_from_name(name: str) -> str | None:
    """The GPU table's name (peloton/modelaware/gpus.py) for a name nvidia-smi prints, by its words:
    `NVIDIA H100 80GB HBM3` -> h100, `Tesla V100-SXM2-32GB` -> v100, `NVIDIA A10G` -> a10g. None when no word is
    a model of the table (`NVIDIA GeForce RTX 4090`): the host keeps the label's default."""
    for word in re.split(r"[^a-z0-9]+", name.lower()):
        if word in BUILTIN and word not in ("unknown", "sim-gpu"):
            return word
    return None


def gpu_model_of(names: list[str]) -> str | None:
    """One model for the host when every GPU has the same known one; None otherwise (a host has one gpu_model)."""
    models = {gpu_model_from_name(n) for n in names}
    return models.pop() if len(models) == 1 else None


def parse_meminfo_total_mib(text: str) -> float:
    """MemTotal of /proc/meminfo (kB) in MiB; 0.0 when absent."""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            try:
                kib = float(parts[1])
            except (IndexError, ValueError):
                return 0.0
            unit = parts[2].lower() if len(parts) > 2 else "kb"
            if unit == "mb":
                return kib
            if unit == "gb":
                return kib * 1024
            return kib / 1024.0
    return 0.0


def _mem_total_mib() -> float:
    try:
        return parse_meminfo_total_mib(Path("/proc/meminfo").read_text())
    except OSError:
        pass
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
        return float(pages * page_size) / (1024 * 1024)
    except (ValueError, OSError, AttributeError):
        return 0.0


def machine_resources(data_dir: Path | str | None = None, gpu_count: int | None = None) -> Resources:
    """This machine as a Resources vector: all cores, MemTotal, free disk of `data_dir` (cwd if None), GPUs.

    `gpu_count` skips GPU detection when the caller already ran it."""
    path = Path(data_dir) if data_dir is not None else Path.cwd()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        disk_mib = float(shutil.disk_usage(path).free) / (1024 * 1024)
    except OSError:
        disk_mib = 0.0
    return Resources(
        cpu=float(os.cpu_count() or 1),
        mem=_mem_total_mib(),
        disk=disk_mib,
        gpu=len(detect_gpus()) if gpu_count is None else gpu_count,
    )
