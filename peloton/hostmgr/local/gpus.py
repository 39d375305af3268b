"""What the machine the local backend runs on has: GPUs (via nvidia-smi), cores, memory and disk."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from peloton.domain.resources import Resources
from peloton.modelaware.gpus import BUILTIN

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


def _nvidia_smi(query: str) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, f"--query-gpu={query}", "--format=csv,noheader"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout


def detect_gpus() -> list[int]:
    """Indices of the NVIDIA GPUs on this machine; [] when there is no nvidia-smi or it fails."""
    return detect().indices


@dataclass(frozen=True, slots=True)
class Detected:
    """What nvidia-smi says of this machine's GPUs."""
    indices: list[int]
    gpu_model: str | None  # the GPU table's name for every GPU's model; None: none, unknown or mixed


def detect() -> Detected:
    """This machine's GPUs and their model, in one call of nvidia-smi."""
    text = _nvidia_smi("index,name")
    if text is None:
        return Detected([], None)
    return Detected(parse_nvidia_smi_indices(text), gpu_model_of(parse_nvidia_smi_names(text)))


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
