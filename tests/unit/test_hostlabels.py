"""The well-known host labels (gpu_model, nic_gbps, gpu_link) and the groups of simulated hosts."""

from __future__ import annotations

import pytest

from peloton.domain.hostgroups import HostGroup, parse_host_group, parse_host_groups
from peloton.domain.resources import Resources
from peloton.errors import InvalidArgument
from peloton.modelaware import hostlabels
from peloton.modelaware.hostlabels import HostHardware


def test_read_checks_and_normalizes_the_well_known_labels() -> None:
    labels = {"gpu_model": " A100 ", "nic_gbps": "12.5", "gpu_link": "NVLink", "rack": "r1"}
    assert hostlabels.read(labels) == {"gpu_model": "a100", "nic_gbps": 12.5, "gpu_link": "nvlink"}
    assert hostlabels.read({"rack": "r1"}) == {}


@pytest.mark.parametrize(("labels", "message"), [
    ({"nic_gbps": "fast"}, "labels.nic_gbps: expected a positive number of Gbit/s, got 'fast'"),
    ({"nic_gbps": "0"}, "labels.nic_gbps: expected a positive number of Gbit/s, got '0'"),
    ({"nic_gbps": "-5"}, "labels.nic_gbps: expected a positive number of Gbit/s, got '-5'"),
    ({"nic_gbps": "nan"}, "labels.nic_gbps: expected a positive number of Gbit/s, got 'nan'"),
    ({"nic_gbps": "inf"}, "labels.nic_gbps: expected a positive number of Gbit/s, got 'inf'"),
    ({"nic_gbps": "1e9"}, "labels.nic_gbps: expected a positive number of Gbit/s, got '1e9'"),
    ({"gpu_link": "nvswitch"}, "labels.gpu_link: expected one of pcie, nvlink, got 'nvswitch'"),
    ({"gpu_model": "Tesla V100"}, "labels.gpu_model: expected a GPU model's name"),
    ({"gpu_model": ""}, "labels.gpu_model: expected a GPU model's name"),
    ({"gpu_model": "x" * 65}, "labels.gpu_model: expected a GPU model's name"),
])
def test_read_names_the_label_at_fault(labels: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        hostlabels.read(labels)
    assert e.value.message.startswith(message)
    assert e.value.field == "labels." + next(iter(labels))


def test_hardware_applies_the_defaults() -> None:
    assert hostlabels.hardware({}, has_gpus=True) == HostHardware(
        "unknown", 25.0, "pcie", ("gpu_model", "nic_gbps", "gpu_link"))
    assert hostlabels.hardware({"gpu_model": "t4", "nic_gbps": "50"}, has_gpus=True) == HostHardware(
        "t4", 50.0, "pcie", ("gpu_link",))
    assert hostlabels.hardware({"gpu_model": "h100", "nic_gbps": "400", "gpu_link": "nvlink"}, True) == \
        HostHardware("h100", 400.0, "nvlink", ())
    # a host without GPUs has neither a GPU model nor a GPU link, whatever its labels say
    assert hostlabels.hardware({"gpu_model": "t4", "gpu_link": "nvlink"}, has_gpus=False) == HostHardware(
        "", 25.0, "", ("nic_gbps",))
    with pytest.raises(InvalidArgument, match=r"^node\.nic_gbps: "):
        hostlabels.hardware({"nic_gbps": "x"}, True, field="node")


def test_hardware_lenient_assumes_the_default_for_a_bad_label() -> None:
    hw, problems = hostlabels.hardware_lenient({"gpu_model": "V100", "nic_gbps": "fast", "gpu_link": "?"}, True)
    assert hw == HostHardware("v100", 25.0, "pcie", ("nic_gbps", "gpu_link"))
    assert problems == ["labels.nic_gbps: expected a positive number of Gbit/s, got 'fast'",
                        "labels.gpu_link: expected one of pcie, nvlink, got '?'"]
    assert hostlabels.hardware_lenient({}, False) == (HostHardware("", 25.0, "", ("nic_gbps",)), [])


def test_parse_labels_flag() -> None:
    assert hostlabels.parse_labels("gpu_model=T4, nic_gbps=50.0 ,zone=us-east/1a,", "--x") == {
        "gpu_model": "t4", "nic_gbps": "50", "zone": "us-east/1a"}
    assert hostlabels.parse_labels("nic_gbps=12.5", "--x") == {"nic_gbps": "12.5"}
    assert hostlabels.parse_labels("", "--x") == {}


@pytest.mark.parametrize(("text", "message"), [
    ("gpu_model", "--x: expected KEY=VALUE, got 'gpu_model'"),
    ("=t4", "--x: expected KEY=VALUE, got '=t4'"),
    ("a b=1", "--x: label name 'a b'"),
    ("host=h1", "--x: label 'host' is set by the backend"),
    ("rack=a,rack=b", "--x: label 'rack' given twice"),
    ("rack=", "--x: label rack: expected a value of 1 to 256 printable characters, got ''"),
    ("nic_gbps=fast", "--x: labels.nic_gbps: expected a positive number of Gbit/s, got 'fast'"),
])
def test_parse_labels_flag_errors_name_the_flag(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        hostlabels.parse_labels(text, "--x")
    assert e.value.message.startswith(message)
    assert e.value.field == "--x"


def test_parse_host_group() -> None:
    g = parse_host_group("8:cpu=48,mem=192Gi,gpu=4:gpu_model=t4,nic_gbps=50", "--g")
    assert g == HostGroup(8, Resources(cpu=48, mem=192 * 1024, gpu=4), (("gpu_model", "t4"), ("nic_gbps", "50")))
    assert parse_host_group("2:cpu=4", "--g") == HostGroup(2, Resources(cpu=4))
    groups = parse_host_groups(["1:cpu=1", "3:cpu=2,gpu=8:gpu_link=nvlink"], "--g")
    assert [x.count for x in groups] == [1, 3] and groups[1].labels == (("gpu_link", "nvlink"),)
    assert parse_host_groups(None, "--g") == ()


@pytest.mark.parametrize(("texts", "message"), [
    (["cpu=4"], "--g: expected COUNT:RESOURCES[:LABELS]"),
    (["4"], "--g: expected COUNT:RESOURCES[:LABELS]"),
    (["x:cpu=4"], "--g: expected COUNT:RESOURCES[:LABELS]"),
    (["0:cpu=4"], "--g: COUNT must be 1..1000000, got 0"),
    (["2:mem=4Gi"], "--g: cpu must be greater than 0"),
    (["2:cpu=4,tpu=1"], "--g: unknown resource 'tpu'"),
    (["2:cpu=4:gpu_model=t4"], "--g: labels.gpu_model: the hosts have no GPUs (gpu=0)"),
    (["1:cpu=1", "2:cpu=4,gpu=1:nic_gbps=0"], "--g[1]: labels.nic_gbps: expected a positive number"),
    (["600000:cpu=1", "600000:cpu=1"], "--g: 1200000 hosts in all, more than 1000000"),
])
def test_parse_host_groups_errors_name_the_flag(texts: list[str], message: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        parse_host_groups(texts, "--g")
    assert e.value.message.startswith(message)


def test_a_host_shows_its_hardware_and_a_bad_attribute_does_not_hide_it() -> None:
    """What `host list -o json` carries: a Mesos agent's attributes are its labels, not ours to refuse."""
    from peloton.api.convert import host_to_proto
    from peloton.domain.launch import HostInfo

    h = host_to_proto(HostInfo("a1", "10.0.0.1", Resources(cpu=8, gpu=2), Resources(),
                               labels={"gpu_model": "A100", "nic_gbps": "fast"}), offer_held=False)
    assert (h.hardware.gpu_model, h.hardware.nic_gbps, h.hardware.gpu_link) == ("a100", 25.0, "pcie")
    assert list(h.hardware.defaulted) == ["nic_gbps", "gpu_link"]
    assert list(h.hardware.invalid) == ["labels.nic_gbps: expected a positive number of Gbit/s, got 'fast'"]
    assert dict(h.labels) == {"gpu_model": "A100", "nic_gbps": "fast"}  # the labels as they are
    cpu = host_to_proto(HostInfo("c1", "10.0.0.2", Resources(cpu=8), Resources(), labels={"nic_gbps": "100"}),
                        offer_held=False)
    assert (cpu.hardware.gpu_model, cpu.hardware.nic_gbps, cpu.hardware.gpu_link) == ("", 100.0, "")
    assert list(cpu.hardware.defaulted) == [] and list(cpu.hardware.invalid) == []
