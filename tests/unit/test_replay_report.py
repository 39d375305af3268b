"""The replay report (peloton/replay/report.py): the table and the JSON document carry every metric of every policy;
the SVG plots are well-formed, one series per policy, axes labelled."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from peloton.replay.metrics import Cluster, JobRecord, Replay, Sample
from peloton.replay.report import (
    PLOTS,
    box_chart,
    compare,
    document,
    flatten,
    plots,
    step_chart,
    table,
    ticks,
    write_plots,
)

SVG = "{http://www.w3.org/2000/svg}"


def replay(shift: float) -> Replay:
    """Three jobs of 1, 4 and 8 GPUs; `shift` delays the 8-GPU one (a worse policy)."""
    jobs = [JobRecord("a", "p", 1, 0, 0, 10, {"h1": 1}, frozenset({"r1"})),
            JobRecord("b", "p", 4, 0, 0, 20, {"h2": 4}, frozenset({"r1"})),
            JobRecord("c", "q", 8, 5, 20 + shift, 40 + shift, {"h1": 4, "h2": 4}, frozenset({"r1", "r2"}))]
    timeline = [Sample(0, 5, 1), Sample(10, 4, 1), Sample(20, 0, 1), Sample(20 + shift, 8, 0),
                Sample(40 + shift, 0, 0)]
    return Replay(Cluster(2, 4, 2), jobs, timeline, {"p": 4, "q": 4})


REPLAYS = {"fifo": replay(30), "default": replay(0), "model-aware": replay(5)}


def test_the_table_has_a_column_per_policy_and_a_row_per_metric_aligned() -> None:
    results = compare(REPLAYS)
    text = table(results)
    lines = text.splitlines()
    header = lines[0]
    assert header.split() == ["metric", "fifo", "default", "model-aware"]
    keys = set(flatten(results["fifo"]))
    assert {line.split()[0] for line in lines[1:]} == keys
    for key in ("jobs", "jct_mean_s", "jct_p99_s", "makespan_s", "gpu_alloc_frac", "partial_gang_gpu_s",
                "gpu_alloc_bound", "by_size.5-8.jct_mean_s", "pools.q.ftf", "largest_gang_wait_s"):
        assert key in keys
    starts = [header.index(p) for p in ("fifo", "default", "model-aware")]
    for line in lines[1:]:
        for s in starts:  # every column starts where its header does
            assert line[s - 2:s] == "  " and line[s] != " "
    row = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert row["makespan_s"] == ["70.0", "40.0", "45.0"]
    assert row["jobs"] == ["3", "3", "3"] and row["gpu_alloc_frac"][1] == "0.781"  # 250 GPU-s / (8 x 40)
    assert row["hosts_per_gang_mean"] == ["1.33", "1.33", "1.33"]
    assert row["by_size.17+.jct_mean_s"] == ["-", "-", "-"]


def test_the_json_document_carries_every_metric_of_every_policy() -> None:
    results = compare(REPLAYS)
    doc = json.loads(json.dumps(document(results)))
    assert list(doc["policies"]) == ["fifo", "default", "model-aware"]
    for p, m in results.items():
        assert flatten(doc["policies"][p]) == pytest.approx(flatten(m))
    assert doc["policies"]["fifo"]["jct_mean_s"] > doc["policies"]["default"]["jct_mean_s"]


def _parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def _series(root: ET.Element) -> list[str]:
    return [g.get("data-policy", "") for g in root.iter(f"{SVG}g") if g.get("class") == "series"]


def _labels(root: ET.Element) -> dict[str, str]:
    return {t.get("class", ""): t.text or "" for t in root.iter(f"{SVG}text")
            if (t.get("class") or "").startswith("axis-label")}


def test_the_plots_are_well_formed_with_a_series_per_policy_and_labelled_axes(tmp_path: Path) -> None:
    paths = write_plots(REPLAYS, tmp_path / "plots")
    assert [p.name for p in paths] == list(PLOTS)
    for path in paths:
        root = _parse(path.read_text())
        assert _series(root) == ["fifo", "default", "model-aware"]
        labels = _labels(root)
        assert labels["axis-label x"] and labels["axis-label y"]
    queue = _parse((tmp_path / "plots" / "queue.svg").read_text())
    assert _labels(queue) == {"axis-label x": "time (s)", "axis-label y": "queue length"}
    alloc = _parse((tmp_path / "plots" / "allocation.svg").read_text())
    assert "1" in [t.text for t in alloc.iter(f"{SVG}text")]  # a share: the axis runs to 1
    boxes = _parse((tmp_path / "plots" / "jct-by-size.svg").read_text())
    # a box per gang size that has jobs (1, 2-4, 5-8) per policy
    for g in boxes.iter(f"{SVG}g"):
        if g.get("class") == "series":
            assert len(list(g.iter(f"{SVG}rect"))) == 3


def test_a_step_chart_draws_each_change_and_escapes_names() -> None:
    svg = step_chart({"a<&>\"b": [(0, 0), (1, 2), (2, 2), (3, 0)], "c": []}, "t & t", "x <s>", "y")
    root = _parse(svg)
    assert _series(root) == ["a<&>\"b", "c"]
    path = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "series").find(f"{SVG}path")
    assert path is not None
    d = path.get("d", "")
    assert d.startswith("M") and d.count("V") == 2  # up to 2, down to 0: the equal value at 2 adds no step


def test_a_long_timeline_is_thinned_to_a_few_points_per_pixel() -> None:
    points = [(float(t), float(t % 7)) for t in range(100_000)]
    svg = step_chart({"p": points}, "t", "x", "y")
    _parse(svg)
    assert len(svg) < 200_000
    assert "V" + svg.split("V")[1].split(" ")[0] in svg  # still a drawn line


def test_a_box_chart_without_values_is_still_an_empty_well_formed_plot() -> None:
    root = _parse(box_chart(["1"], {"p": {}}, "t", "x", "y"))
    assert _series(root) == ["p"]
    assert plots({})["queue.svg"].startswith("<svg")


def test_ticks_are_round_and_cover_the_range() -> None:
    assert ticks(0, 10) == [0, 2, 4, 6, 8, 10]
    assert ticks(0, 0.9)[-1] >= 0.9 and ticks(3, 3)[0] == 3 and ticks(3, 3)[-1] == 4
    t = ticks(0, 28_800)
    assert t[0] == 0 and t[-1] >= 28_800 and len(t) <= 7


def test_time_in_the_plots_runs_from_the_first_submission_as_the_makespan_does() -> None:
    # the driver samples the empty cluster at virtual 0; the trace's first job comes at 100. The allocation line
    # starts where the makespan does, so the area under it over its length is gpu_alloc_frac (docs: "The report")
    jobs = [JobRecord("a", "p", 8, 100, 100, 110, {"h1": 4, "h2": 4}, frozenset({"r1"}))]
    r = Replay(Cluster(2, 4), jobs, [Sample(0, 0, 0), Sample(100, 8, 0), Sample(110, 0, 0)])
    assert compare({"p": r})["p"]["gpu_alloc_frac"] == 1
    alloc = _parse(plots({"p": r})["allocation.svg"])
    ticks_x = [float(t.text or "nan") for t in alloc.iter(f"{SVG}text") if t.get("text-anchor") == "middle"
               and t.get("y") == str(380 - 52 + 18)]
    assert ticks_x[0] == 0 and ticks_x[-1] == 10  # 0 to 10 s, not 0 to 110
    path = next(g for g in alloc.iter(f"{SVG}g") if g.get("class") == "series").find(f"{SVG}path")
    assert path is not None and path.get("d", "").startswith("M70.0,36.0")  # at the top (all 8 GPUs) from x = 0
