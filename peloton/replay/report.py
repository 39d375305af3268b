"""The report comparing policies' replays: one table (a row per metric, a column per policy), one JSON document, and
plots written as SVG by hand (no plotting library): queue length and GPU allocation over time, JCT by gang size.
How to read them: docs/scheduling-quality.md, "The report"."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from peloton.replay.metrics import SIZE_BUCKETS, Replay, Sample, percentile, size_bucket, summarize

# One colour per policy, in the order given (colour-blind safe: Okabe and Ito's palette).
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
PLOTS = ("queue.svg", "allocation.svg", "jct-by-size.svg")


def flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested metrics as one level: `by_size.2-4.jct_mean_s`, `pools.batch.ftf`."""
    out: dict[str, Any] = {}
    for k, v in doc.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def cell(key: str, v: Any) -> str:
    """Seconds to a tenth, shares and fairness ratios to a thousandth, counts as they are, means of counts to a
    hundredth; `-` for none."""
    if v is None:
        return "-"
    if key.endswith("_s"):
        return f"{v:.1f}"
    if key.endswith(("_frac", "_bound", "ftf", "ftf_max")):
        return f"{v:.3f}"
    if isinstance(v, int):  # bool too
        return str(v)
    return f"{v:.2f}"


def table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """A row per metric (every key of every policy's document, in first-seen order), a column per policy; columns
    aligned as the CLI's tables are (peloton/cli/render.py)."""
    flat = {p: flatten(m) for p, m in results.items()}
    keys: dict[str, None] = {}
    for f in flat.values():
        keys.update(dict.fromkeys(f))
    rows = [[k] + [cell(k, f.get(k)) for f in flat.values()] for k in keys]
    cells = [["metric", *results]] + rows
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def document(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`-o json`: each policy's metrics under its name."""
    return {"policies": {p: dict(m) for p, m in results.items()}}


# --- SVG -------------------------------------------------------------------------------------------------------------

W, H = 760, 380
LEFT, RIGHT, TOP, BOTTOM = 70, 150, 36, 52  # the plot area's margins; the legend sits in the right one


def ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round values (1, 2 or 5 times a power of ten apart) covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    return [first + i * step for i in range(int(math.ceil((hi - first) / step)) + 1)]


def _num(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".")


class _Frame:
    """A plot area with its axes: maps data to pixels and writes the axes, their ticks and labels, and the title."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        self.xt = ticks(min(xs, default=0.0), max(xs, default=1.0))
        self.yt = ticks(min(0.0, *ys) if ys else 0.0, max(ys, default=1.0))

    def x(self, v: float) -> float:
        lo, hi = self.xt[0], self.xt[-1]
        return LEFT + (v - lo) / (hi - lo) * (W - LEFT - RIGHT)

    def y(self, v: float) -> float:
        lo, hi = self.yt[0], self.yt[-1]
        return H - BOTTOM - (v - lo) / (hi - lo) * (H - TOP - BOTTOM)

    def axes(self, title: str, xlabel: str, ylabel: str, xticks: bool = True) -> list[str]:
        x0, x1, y0, y1 = LEFT, W - RIGHT, H - BOTTOM, TOP
        out = [f'<text class="title" x="{W / 2:.0f}" y="20" text-anchor="middle">{escape(title)}</text>',
               f'<g class="axes" stroke="#333" fill="none"><path d="M{x0},{y1} V{y0} H{x1}"/></g>',
               f'<text class="axis-label x" x="{(x0 + x1) / 2:.0f}" y="{H - 12}" text-anchor="middle">'
               f'{escape(xlabel)}</text>',
               f'<text class="axis-label y" x="18" y="{(y0 + y1) / 2:.0f}" text-anchor="middle" '
               f'transform="rotate(-90 18 {(y0 + y1) / 2:.0f})">{escape(ylabel)}</text>']
        for v in self.yt:
            out.append(f'<path d="M{x0 - 4},{self.y(v):.1f} H{x1}" stroke="#ddd"/>'
                       f'<text x="{x0 - 8}" y="{self.y(v) + 4:.1f}" text-anchor="end">{_num(v)}</text>')
        if xticks:
            for v in self.xt:
                out.append(f'<path d="M{self.x(v):.1f},{y0} v4" stroke="#333"/>'
                           f'<text x="{self.x(v):.1f}" y="{y0 + 18}" text-anchor="middle">{_num(v)}</text>')
        return out


def _svg(body: list[str]) -> str:
    return "\n".join([f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
                      f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
                      f'<rect width="{W}" height="{H}" fill="white"/>', *body, "</svg>", ""])


def _legend(names: Sequence[str]) -> list[str]:
    out = []
    for i, name in enumerate(names):
        y = TOP + 8 + 18 * i
        out.append(f'<g class="legend"><rect x="{W - RIGHT + 14}" y="{y - 9}" width="14" height="10" '
                   f'fill="{COLOURS[i % len(COLOURS)]}"/><text x="{W - RIGHT + 34}" y="{y}">{escape(name)}</text></g>')
    return out


def step_chart(series: Mapping[str, Sequence[tuple[float, float]]], title: str, xlabel: str, ylabel: str,
               ymax: float | None = None) -> str:
    """Each series a step line (a value holds until the next point), one `<g class="series">` per name; the y axis
    reaches at least `ymax` (a share: 1)."""
    ys = [y for s in series.values() for _, y in s] + ([] if ymax is None else [ymax])
    frame = _Frame([x for s in series.values() for x, _ in s], ys)
    body = frame.axes(title, xlabel, ylabel)
    for i, (name, points) in enumerate(series.items()):
        d, last = [], None
        for x, y in _thin(points, frame.x):
            if last is None:
                d.append(f"M{frame.x(x):.1f},{frame.y(y):.1f}")
            elif y != last:  # a run of equal values is one horizontal segment
                d.append(f"H{frame.x(x):.1f} V{frame.y(y):.1f}")
            last = y
        if points:
            d.append(f"H{frame.x(points[-1][0]):.1f}")
        body.append(f'<g class="series" data-policy={quoteattr(name)}><path d="{" ".join(d)}" fill="none" '
                    f'stroke="{COLOURS[i % len(COLOURS)]}" stroke-width="1.5"/></g>')
    return _svg(body + _legend(list(series)))


def _thin(points: Sequence[tuple[float, float]], px: Callable[[float], float]) -> list[tuple[float, float]]:
    """At most four points per pixel column (its first, lowest, highest and last, in time order): a day of events
    draws the same picture from a file a few hundred kilobytes long."""
    out: list[tuple[float, float]] = []
    i = 0
    while i < len(points):
        col = int(px(points[i][0]))
        k = i
        while k + 1 < len(points) and int(px(points[k + 1][0])) == col:
            k += 1
        run = points[i:k + 1]
        keep = {0, len(run) - 1, min(range(len(run)), key=lambda n: run[n][1]),
                max(range(len(run)), key=lambda n: run[n][1])}
        out.extend(run[n] for n in sorted(keep))
        i = k + 1
    return out


def box_chart(groups: Sequence[str], data: Mapping[str, Mapping[str, Sequence[float]]], title: str, xlabel: str,
              ylabel: str) -> str:
    """Per group (x) a box per series: whiskers at the smallest and largest value, the box from p25 to p75, a line
    at the median (nearest rank). One `<g class="series">` per series name."""
    values = [v for d in data.values() for g in groups for v in d.get(g, ())]
    frame = _Frame([0.0, float(len(groups))], values)
    body = frame.axes(title, xlabel, ylabel, xticks=False)
    slot = (frame.x(1) - frame.x(0)) / (len(data) + 1)
    for gi, g in enumerate(groups):
        body.append(f'<text x="{frame.x(gi + 0.5):.1f}" y="{H - BOTTOM + 18}" text-anchor="middle">{escape(g)}'
                    "</text>")
    for si, (name, by_group) in enumerate(data.items()):
        colour = COLOURS[si % len(COLOURS)]
        parts = []
        for gi, g in enumerate(groups):
            vs = list(by_group.get(g, ()))
            if not vs:
                continue
            cx = frame.x(gi) + slot * (si + 1)
            q1, q2, q3 = (percentile(vs, p) or 0.0 for p in (25, 50, 75))
            lo, hi, half = frame.y(min(vs)), frame.y(max(vs)), slot * 0.35
            parts.append(f'<path d="M{cx:.1f},{lo:.1f} V{hi:.1f}" stroke="{colour}"/>'
                         f'<rect x="{cx - half:.1f}" y="{frame.y(q3):.1f}" width="{2 * half:.1f}" '
                         f'height="{max(frame.y(q1) - frame.y(q3), 1):.1f}" fill="{colour}" fill-opacity="0.35" '
                         f'stroke="{colour}"/><path d="M{cx - half:.1f},{frame.y(q2):.1f} h{2 * half:.1f}" '
                         f'stroke="{colour}" stroke-width="2"/>')
        body.append(f'<g class="series" data-policy={quoteattr(name)}>{"".join(parts)}</g>')
    return _svg(body + _legend(list(data)))


def _unit(span: float) -> tuple[str, float]:
    return ("h", 3600.0) if span >= 3 * 3600 else ("min", 60.0) if span >= 180 else ("s", 1.0)


def plots(replays: Mapping[str, Replay]) -> dict[str, str]:
    """The three plots (file name -> SVG text) of the policies' replays; time from each replay's first submission
    (the metrics' t0: where its makespan starts), or its first sample when it has no jobs."""
    starts = {p: min((j.submit for j in r.jobs), default=r.timeline[0].time if r.timeline else 0.0)
              for p, r in replays.items()}
    span = max((r.timeline[-1].time - starts[p] for p, r in replays.items() if r.timeline), default=0.0)
    unit, per = _unit(span)

    def from_start(r: Replay, t0: float) -> list[Sample]:
        """The samples from t0 on, the one in force at t0 moved to it (before it: the empty cluster)."""
        before = [s for s in r.timeline if s.time <= t0]
        after = [s for s in r.timeline if s.time > t0]
        return ([replace(before[-1], time=t0)] if before else []) + after

    def series(attr: str, scale: Mapping[str, float]) -> dict[str, list[tuple[float, float]]]:
        return {p: [((s.time - starts[p]) / per, float(getattr(s, attr)) / scale[p]) for s in from_start(r, starts[p])]
                for p, r in replays.items()}

    ones = dict.fromkeys(replays, 1.0)
    gpus = {p: float(r.cluster.gpus) for p, r in replays.items()}
    labels = [label for label, _, _ in SIZE_BUCKETS]
    jct: dict[str, dict[str, list[float]]] = {}
    for p, r in replays.items():
        jct[p] = {}
        for j in r.jobs:
            if j.end is not None:
                jct[p].setdefault(size_bucket(j.gpus), []).append(j.end - j.submit)
    present = [g for g in labels if any(g in d for d in jct.values())] or labels
    return {
        "queue.svg": step_chart(series("queue_length", ones), "Gangs waiting", f"time ({unit})", "queue length"),
        "allocation.svg": step_chart(series("gpus_allocated", gpus), "GPU allocation", f"time ({unit})",
                                     "share of the cluster's GPUs allocated", ymax=1.0),
        "jct-by-size.svg": box_chart(present, jct, "Job completion time by gang size", "gang size (GPUs)",
                                     "JCT (s)"),
    }


def write_plots(replays: Mapping[str, Replay], directory: Path) -> list[Path]:
    """The plots of the policies' replays written into `directory` (created if absent): the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, svg in plots(replays).items():
        path = directory / name
        path.write_text(svg)
        paths.append(path)
    return paths


def compare(replays: Mapping[str, Replay]) -> dict[str, dict[str, Any]]:
    """Each policy's metrics, in the order given: what `table` and `document` take."""
    return {p: summarize(r) for p, r in replays.items()}
