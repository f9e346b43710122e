"""Crossovers: for a swept experiment (config/sweeps.py), each judged metric and the peak GPU
memory against each axis, a line per technique, and in words where two lines cross.

A crossing counts only beyond the noise: the two lines change order between two neighbouring
axis values, and at both of them the runs' 95 % intervals (``<metric>_ci_low/_ci_high``, from
repeats) do not overlap. Where the intervals overlap at either end the lines cross within the
noise, and the page says that instead; without repeats it says the runs cannot tell. OOM and
skipped points are kept as points without a value, drawn as marks on the axis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from hopperlab.core import rundir
from hopperlab.results import correctness, marks
from hopperlab.results.machines.references import direction
from hopperlab.results.machines.tradeoffs import MEMORY_METRICS
from hopperlab.results.rows import RunRow

#: between a point variant's technique and its axes (config/sweeps.py's SEPARATOR)
SEPARATOR = "."


@dataclass(frozen=True)
class Point:
    x: float
    y: float | None          # None: the run did not end ok (``status``)
    low: float | None = None
    high: float | None = None
    status: str = "ok"


@dataclass
class Series:
    """One technique's line over one axis (the other axes held at ``fixed``)."""

    technique: str
    metric: str
    axis: str
    fixed: str = ""
    points: list[Point] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.technique + (f" ({self.fixed})" if self.fixed else "")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def axes_of(row: RunRow) -> dict[str, float]:
    """A point run's axis values, from its name's axes and its spec's params and knobs (only
    numeric axes draw a line)."""
    parts = row.variant.split(SEPARATOR)
    if len(parts) < 2:
        return {}
    try:
        spec = rundir.read_json(row.run_dir / rundir.SPEC_FILE)
    except (OSError, ValueError):
        spec = {}
    values = {**(spec.get("knobs") or {}), **(spec.get("params") or {})} \
        if isinstance(spec, Mapping) else {}
    out = {}
    for part in parts[1:]:
        axis = part.split("-", 1)[0]
        number = _number(values.get(axis, row.knobs.get(axis)))
        if number is not None:
            out[axis] = number
    return out


def _point(row: RunRow, x: float, metric: str) -> Point:
    """The run's point on its line; a run that reads DIFFERENT is a point without a value
    (drawn as a mark on the axis, ``DIFFERENT: not a finding``): no line crosses through it."""
    if not correctness.offered(row):
        return Point(x, None, status=correctness.NOT_A_FINDING)
    if row.status != "ok" or metric not in row.metrics:
        return Point(x, None, status=row.status)
    return Point(x, row.metrics[metric], row.metrics.get(f"{metric}_ci_low"),
                 row.metrics.get(f"{metric}_ci_high"))


def series_of(runs: Sequence[RunRow], metric: str) -> dict[str, list[Series]]:
    """axis -> one line per technique (and per value of the other axes) of ``metric``."""
    out: dict[str, dict[tuple[str, str], Series]] = {}
    for row in runs:
        axes = axes_of(row)
        technique = row.variant.split(SEPARATOR, 1)[0]
        for axis, x in axes.items():
            fixed = ", ".join(f"{a} {v:g}" for a, v in axes.items() if a != axis)
            line = out.setdefault(axis, {}).setdefault(
                (technique, fixed), Series(technique, metric, axis, fixed))
            line.points.append(_point(row, x, metric))
    for lines in out.values():
        for line in lines.values():
            line.points.sort(key=lambda p: p.x)
    return {axis: list(lines.values()) for axis, lines in out.items()}


def _apart(a: Point, b: Point) -> bool | None:
    """Whether two points' intervals do not overlap (None: either has no interval)."""
    if None in (a.low, a.high, b.low, b.high):
        return None
    return a.high < b.low or b.high < a.low  # type: ignore[operator]


@dataclass(frozen=True)
class Crossing:
    a: str
    b: str
    metric: str
    axis: str
    x_before: float
    x_after: float
    #: True: beyond the noise; False: within it; None: no intervals to tell
    beyond: bool | None
    before: tuple[Point, Point]
    after: tuple[Point, Point]

    def sentence(self) -> str:
        def at(p: tuple[Point, Point], x: float) -> str:
            ratio = p[0].y / p[1].y if p[1].y else float("nan")  # type: ignore[operator]
            iv = (f" [{p[0].low:.4g}, {p[0].high:.4g}] against [{p[1].low:.4g}, "
                  f"{p[1].high:.4g}]" if p[0].low is not None and p[1].low is not None else "")
            return f"at {self.axis} {x:g} {self.a} is {ratio:.2f}x {self.b}{iv}"

        head = (f"{self.a} and {self.b} cross on {self.metric} between {self.axis} "
                f"{self.x_before:g} and {self.x_after:g}: {at(self.before, self.x_before)}; "
                f"{at(self.after, self.x_after)}")
        if self.beyond is True:
            return head + ": beyond the noise (the 95 % intervals are apart at both)"
        if self.beyond is False:
            return head + (": within the noise (the 95 % intervals overlap at one of them): "
                           "no crossing shown")
        return head + ": 1 sample each, the noise is unknown (measure with repeats to tell)"


def crossings(a: Series, b: Series) -> list[Crossing]:
    """Where line ``a`` and line ``b`` change order between neighbouring shared axis values."""
    pa = {p.x: p for p in a.points if p.y is not None}
    pb = {p.x: p for p in b.points if p.y is not None}
    xs = sorted(set(pa) & set(pb))
    out = []
    for x0, x1 in zip(xs, xs[1:]):
        d0 = pa[x0].y - pb[x0].y  # type: ignore[operator]
        d1 = pa[x1].y - pb[x1].y  # type: ignore[operator]
        if d0 == 0 or d1 == 0 or (d0 > 0) == (d1 > 0):
            continue
        apart = [_apart(pa[x0], pb[x0]), _apart(pa[x1], pb[x1])]
        beyond = None if None in apart else all(apart)
        out.append(Crossing(a.label, b.label, a.metric, a.axis, x0, x1, beyond,
                            (pa[x0], pb[x0]), (pa[x1], pb[x1])))
    return out


def judged_metrics(runs: Sequence[RunRow]) -> list[str]:
    """The experiment's headline metrics with a direction, and its peak GPU memory metric."""
    out = []
    for r in runs:
        for m in r.headline_metrics:
            if m not in out and direction(r.family, m) and any(m in x.metrics for x in runs):
                out.append(m)
    memory = next((name for name, _ in MEMORY_METRICS if any(name in r.metrics for r in runs)),
                  None)
    if memory and memory not in out:
        out.append(memory)
    return out


def experiment_crossings(runs: Sequence[RunRow]) -> list[Crossing]:
    """Every crossing of two techniques' lines, per judged metric and axis (same other-axes
    values only)."""
    out = []
    for metric in judged_metrics(runs):
        for lines in series_of(runs, metric).values():
            for i, a in enumerate(lines):
                for b in lines[i + 1:]:
                    if a.fixed == b.fixed and a.technique != b.technique:
                        out.extend(crossings(a, b))
    return out


def swept(runs: Sequence[RunRow]) -> bool:
    return any(axes_of(r) for r in runs)


def line_chart(lines: Sequence[Series], metric: str, axis: str) -> str:
    """``metric`` against ``axis``, a line per technique with its 95 % interval as error
    bars, runs that did not end ok as an x on the axis with their status; base64 PNG."""
    import base64
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0, 3.2), dpi=80)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for line in lines:
        ok = [p for p in line.points if p.y is not None]
        errs = [[p.y - p.low if p.low is not None else 0 for p in ok],  # type: ignore[operator]
                [p.high - p.y if p.high is not None else 0 for p in ok]]  # type: ignore[operator]
        drawn = ax.errorbar([p.x for p in ok], [p.y for p in ok], yerr=errs, marker="o",
                            markersize=3, capsize=2, linewidth=1.2, label=line.label)
        for p in line.points:
            if p.y is None:
                ax.plot([p.x], [0], marker="x", color=drawn[0].get_color(), markersize=8)
                ax.annotate(p.status, (p.x, 0), fontsize=7, textcoords="offset points",
                            xytext=(3, 4))
    ax.set_xlabel(axis, fontsize=8)
    ax.set_ylabel(metric, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def crossover_section(runs: Sequence[RunRow], charts: bool = True) -> str:
    """The report's part for a swept experiment: the crossings in words, then a chart per
    judged metric and axis ('' for an experiment without a sweep)."""
    from html import escape

    if not swept(runs):
        return ""
    found = experiment_crossings(runs)
    words = "".join(f'<li class="crossing">{escape(c.sentence())}</li>' for c in found) \
        or "<li>no two techniques' lines cross on any judged metric</li>"
    stand = sum(bool(marks.stand_in(r)) for r in runs)
    note = (f'<p class="note">{stand} of these runs are {marks.STAND_IN}s (no GPU was '
            "measured): their lines show that the code path runs, not where a technique "
            "pays</p>" if stand else "")
    wrong = correctness.left_out(runs)
    if wrong:
        note += (f'<p class="note">{escape(wrong)}: drawn as marks on the axis, no point of '
                 "any line nor of any crossing</p>")
    out = ['<div class="crossovers"><h4>Against the sweep\'s axes</h4>'
           f"{note}<ul>{words}</ul>"]
    if charts:
        for metric in judged_metrics(runs):
            for axis, lines in series_of(runs, metric).items():
                png = line_chart(lines, metric, axis)
                out.append(f'<figure><img alt="{escape(metric)} against {escape(axis)}" '
                           f'src="data:image/png;base64,{png}"><figcaption>{escape(metric)} '
                           f"against {escape(axis)}, a line per technique (95 % interval "
                           "bars where repeated; x: a run that did not end ok, or that "
                           "reads DIFFERENT)"
                           "</figcaption></figure>")
    return "\n".join(out) + "</div>"
