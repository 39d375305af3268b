"""Groups of alike simulated hosts: `--sim-host-group` / `--local-host-group COUNT:RESOURCES[:LABELS]`, so that a
heterogeneous cluster (8 hosts of 4 T4s at 50 Gbit/s beside 4 of 8 A100s over NVLink at 400) can be built and
tested on one machine. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from peloton.domain.resources import Resources, parse_resources_flag
from peloton.errors import InvalidArgument
from peloton.modelaware import hostlabels

MAX_GROUP_HOSTS = 1_000_000


@dataclass(frozen=True, slots=True)
class HostGroup:
    count: int
    resources: Resources
    labels: tuple[tuple[str, str], ...] = ()  # (a tuple: settings that hold groups stay hashable)


def parse_host_group(text: str, field: str) -> HostGroup:
    """`8:cpu=48,mem=192Gi,gpu=4:gpu_model=t4,nic_gbps=50` -> HostGroup. InvalidArgument naming `field` (the flag,
    and which of its values: `--sim-host-group[1]`)."""
    count_text, _, rest = text.strip().partition(":")
    res_text, _, labels_text = rest.partition(":")
    if not count_text.strip().isdigit() or not res_text.strip():
        raise InvalidArgument(f"{field}: expected COUNT:RESOURCES[:LABELS] (like 8:cpu=48,mem=192Gi,gpu=4:"
                              f"gpu_model=t4,nic_gbps=50), got {text!r}", field=field)
    count = int(count_text)
    if not 1 <= count <= MAX_GROUP_HOSTS:
        raise InvalidArgument(f"{field}: COUNT must be 1..{MAX_GROUP_HOSTS}, got {count}", field=field)
    resources = parse_resources_flag(res_text, field)
    if not resources.cpu > 0:
        raise InvalidArgument(f"{field}: cpu must be greater than 0", field=field)
    labels = hostlabels.parse_labels(labels_text, field)
    hostlabels.check_for_hosts(labels, resources.gpu > 0, field)
    return HostGroup(count, resources, tuple(sorted(labels.items())))


def parse_host_groups(texts: list[str] | None, field: str) -> tuple[HostGroup, ...]:
    """Every value of a repeatable group flag, in the order given (their hosts are numbered in that order)."""
    groups = tuple(parse_host_group(t, f"{field}[{i}]" if len(texts or ()) > 1 else field)
                   for i, t in enumerate(texts or ()))
    total = sum(g.count for g in groups)
    if total > MAX_GROUP_HOSTS:
        raise InvalidArgument(f"{field}: {total} hosts in all, more than {MAX_GROUP_HOSTS}", field=field)
    return groups
