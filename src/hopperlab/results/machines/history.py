"""``hopperlab history``: a metric over time from MLflow (every run is tagged with its machine
and commit), per machine and run, with change points flagged, as text, ``history.csv`` and
``history.html`` (one chart per series).

Change points: binary segmentation on the series, at least ``MIN_SEGMENT`` runs a side, each
split where the two sides' absolute deviations from their own medians are smallest; a split
counts when the later segment differs from the earlier one by the noise test of
``hopperlab.core.effects`` (each segment's runs as samples: their spread is the run-to-run
noise); then each side is split again.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from hopperlab.core import effects
from hopperlab.core.errors import SpecError
from hopperlab.core.rundir import write_text_atomic
from hopperlab.core.stats import half_width
from hopperlab.results import tracking
from hopperlab.results.machines.mlflow_source import unflatten
from hopperlab.results.machines.references import direction
from hopperlab.results import correctness, marks, scope
from hopperlab.results.tracking.client import reading, retry
from hopperlab.results.tracking.layout import quote_filter_value
from hopperlab.results.tracking.verdicts import from_tags

MIN_SEGMENT = 3


@dataclass
class Point:
    when: float            # seconds since the epoch (the run's start)
    value: float
    commit: str
    run_id: str
    half: float | None = None
    #: the run measured no GPU (``marks.stand_in`` of its tags)
    stand_in: bool = False
    example_price: bool = False


@dataclass
class Change:
    index: int             # the first point after the change
    effect: effects.Effect


@dataclass
class Series:
    machine: str
    key: str
    metric: str
    direction: str | None
    points: list[Point] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    #: the runs left out because their ``correctness`` tag reads DIFFERENT (commit or run id):
    #: a fast wrong run would read as a change point
    different: list[str] = field(default_factory=list)


def change_points(values: Sequence[float], way: str | None,
                  min_effect: float = effects.DEFAULT_MIN_EFFECT,
                  min_segment: int = MIN_SEGMENT) -> list[Change]:
    """The change points of ``values`` (in order): binary segmentation, each split where the
    two sides' absolute deviations from their medians (log scale) are smallest, kept when the
    noise test finds the sides different by at least ``min_effect``."""
    found: list[Change] = []
    logs = [math.log(v) if v > 0 else math.nan for v in values]

    def cost(part: Sequence[float]) -> float:
        med = sorted(part)[len(part) // 2]
        return sum(abs(x - med) for x in part)

    def split(lo: int, hi: int) -> None:
        cuts = range(lo + min_segment, hi - min_segment + 1)
        if not cuts or any(math.isnan(x) for x in logs[lo:hi]):
            return
        k = min(cuts, key=lambda c: cost(logs[lo:c]) + cost(logs[c:hi]))
        try:
            e = effects.compare(effects.Measure.of(values[k:hi]),
                                effects.Measure.of(values[lo:k]), direction=way,
                                min_effect=min_effect)
        except ValueError:
            return
        if e.verdict in (effects.WORSE, effects.BETTER):
            found.append(Change(k, e))
            split(lo, k)
            split(k, hi)

    split(0, len(values))
    return sorted(found, key=lambda c: c.index)


def load(tracking_uri: str, machine: str | None = None, key: str | None = None,
         metric: str | None = None) -> list[Series]:
    """The series on the server: per machine, run key and metric (default: each run's first
    headline metric with a direction), oldest first."""
    filters = [f"tags.machine = {quote_filter_value(machine)}"] if machine else []
    if key:
        if key.count("/") != 2:
            raise SpecError(f"--run {key!r}: a run is named family/experiment/variant")
        for tag, part in zip((tracking.TAG_FAMILY, tracking.TAG_EXPERIMENT,
                              tracking.TAG_VARIANT), key.split("/")):
            filters.append(f"tags.`{tag}` = {quote_filter_value(part)}")
    series: dict[tuple[str, str, str], Series] = {}
    with reading(tracking_uri) as client:
        found = [retry(client.search_runs, [exp.experiment_id], " and ".join(filters),
                       max_results=50000) for exp in retry(client.search_experiments)]
    for runs in found:
        for run in runs:
            tags = run.data.tags
            if tags.get(tracking.TAG_ROLE) == "parent" or tracking.TAG_VARIANT not in tags \
                    or tags.get(tracking.TAG_STATUS) != "ok":
                continue
            family = tags[tracking.TAG_FAMILY]
            run_key = f"{family}/{tags[tracking.TAG_EXPERIMENT]}/{tags[tracking.TAG_VARIANT]}"
            metrics = run.data.metrics
            names = [metric] if metric else _first_directed(unflatten(run.data.params), family)
            for name in names:
                if name not in metrics:
                    continue
                s = series.setdefault((tags.get("machine", "?"), run_key, name), Series(
                    tags.get("machine", "?"), run_key, name, direction(family, name)))
                seen = SimpleNamespace(status="ok", tags=tags,
                                       correctness=from_tags(tags, metrics))
                if not correctness.offered(seen):
                    s.different.append(tags.get("git_commit", "")[:12] or run.info.run_id)
                    continue
                s.points.append(Point(run.info.start_time / 1e3, float(metrics[name]),
                                      tags.get("git_commit", ""), run.info.run_id,
                                      half_width(metrics, name),
                                      bool(marks.stand_in(seen)), marks.example_price(seen)))
    series = {k: s for k, s in series.items() if s.points}  # only DIFFERENT runs: no series
    if not series:
        wanted = ", ".join(f for f in (machine, key, metric) if f)
        raise SpecError(f"{tracking.redact_uri(tracking_uri)}: no ok run"
                        + (f" of {wanted}" if wanted else "") + " with that metric")
    out = sorted(series.values(), key=lambda s: (s.machine, s.key, s.metric))
    for s in out:
        s.points.sort(key=lambda p: p.when)
    return out


def _first_directed(spec: dict, family: str) -> list[str]:
    headline = spec.get("headline_metrics") or []
    return [m for m in headline if direction(family, m)][:1] if isinstance(headline, list) else []


def _when(p: Point) -> str:
    return datetime.fromtimestamp(p.when, timezone.utc).strftime("%Y-%m-%d %H:%M")


def testable(s: Series) -> bool:
    """Enough runs for a change point (``MIN_SEGMENT`` on each side)."""
    return len(s.points) >= 2 * MIN_SEGMENT


def _moved(s: Series) -> str:
    first, last = s.points[0].value, s.points[-1].value
    return f"first to last {(last / first - 1) * 100:+.0f} %" if first > 0 and len(s.points) > 1 \
        else ""


def headline(series: Sequence[Series]) -> str:
    """How many series changed, of those that could be tested; the others said apart, so
    that "0 of 1 changed" never stands beside a +49 % it could not judge."""
    tested = [s for s in series if testable(s)]
    changed = [s for s in tested if s.changes]
    text = (f"{len(changed)} of {len(tested)} series with {2 * MIN_SEGMENT} or more runs "
            "changed beyond run-to-run noise")
    short = len(series) - len(tested)
    if short:
        text += (f"; {short} series with fewer runs not tested (their moves are shown, not "
                 "judged)")
    return text


def facts(series: Sequence[Series]) -> list[str]:
    """What history.html holds (``scope``)."""
    points = [p for s in series for p in s.points]
    out = [f"{len(series)} series, {len(points)} ok runs from MLflow"]
    stand = sum(p.stand_in for p in points)
    if stand:
        out.append(f"{stand} of {len(points)} runs are {marks.STAND_IN}s (no GPU was measured): "
                   "their moves are the CPU's, not findings")
    wrong = sum(len(s.different) for s in series)
    if wrong:
        out.append(f"{wrong} run(s) read DIFFERENT ({correctness.NOT_A_FINDING}): left out of "
                   "the series and their change points")
    if any(p.example_price for p in points):
        out.append(f"prices are {marks.EXAMPLE_PRICE}s")
    out.append("samples per run: " + ("1 (no interval)" if all(p.half is None for p in points)
                                      else "repeats (± their 95 % interval)"))
    return out


def text_lines(series: Sequence[Series]) -> list[str]:
    out = []
    for s in series:
        moved = _moved(s)
        out.append(f"{s.machine} {s.key} {s.metric}: {len(s.points)} runs"
                   + (f" ({moved})" if moved else "") + ", "
                   + (f"{len(s.changes)} change point(s)" if testable(s) else
                      f"not tested for change points (fewer than {2 * MIN_SEGMENT} runs)")
                   + (f"; {len(s.different)} run(s) left out, {correctness.NOT_A_FINDING} "
                      f"({', '.join(s.different)})" if s.different else ""))
        for c in s.changes:
            p = s.points[c.index]
            word = {effects.WORSE: "worse", effects.BETTER: "better"}.get(c.effect.verdict, "")
            out.append(f"    CHANGE {word} at {_when(p)} (commit {p.commit[:12] or '?'}): "
                       f"{c.effect.detail}")
    return out


def y_limits(values: Sequence[float], halves: Sequence[float | None],
             min_effect: float = effects.DEFAULT_MIN_EFFECT) -> tuple[float, float]:
    """The chart's y-axis: the data with their intervals, and at least the band of the
    smallest change the page counts (``min_effect`` around the median), so that a move
    within the noise draws flat instead of as a climb (issue 49: a +0.2 % move filled the
    axis when it started at the data's minimum)."""
    lows = [v - (h or 0.0) for v, h in zip(values, halves)]
    highs = [v + (h or 0.0) for v, h in zip(values, halves)]
    mid = sorted(values)[len(values) // 2]
    band = abs(mid) * min_effect
    return min(*lows, mid - band), max(*highs, mid + band)


def _chart(s: Series) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 2.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = list(range(len(s.points)))
    ax.errorbar(xs, [p.value for p in s.points],
                yerr=[p.half or 0.0 for p in s.points], fmt="o-", ms=3, lw=1, capsize=2)
    for c in s.changes:
        ax.axvline(c.index - 0.5, color="#c62828", ls="--", lw=1)
    if s.points:
        ax.set_ylim(*y_limits([p.value for p in s.points], [p.half for p in s.points]))
    ax.set_xticks(xs, [_when(p)[5:] for p in s.points], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(s.metric, fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    fig.subplots_adjust(bottom=0.35, left=0.1, right=0.98)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return base64.b64encode(buf.getvalue()).decode()


def write(series: Sequence[Series], out: Path) -> tuple[Path, Path]:
    out = Path(out)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["machine", "run", "metric", "when", "value", "half_width", "commit", "run_id",
                "change"])
    for s in series:
        starts = {c.index: c for c in s.changes}
        for i, p in enumerate(s.points):
            c = starts.get(i)
            w.writerow([s.machine, s.key, s.metric, _when(p), p.value, p.half or "", p.commit,
                        p.run_id, c.effect.detail if c else ""])
    csv_path, html_path = out / "history.csv", out / "history.html"
    write_text_atomic(csv_path, buf.getvalue())
    e = html.escape
    body = ["<h1>History</h1>", scope.scope_html(facts(series))]
    body.append(f"<p><b>{e(headline(series))}</b> (a change point: the runs after it differ "
                "from those before beyond their run-to-run noise, by at least 5 %; "
                "docs/benchmarks/noise.md).</p>")
    for s in sorted(series, key=lambda s: not s.changes):
        body.append(f"<h2>{e(s.machine)} {e(s.key)} {e(s.metric)}</h2>")
        body.extend(f"<p>{e(line.strip())}</p>" for line in text_lines([s])[1:])
        body.append(f'<img alt="{e(s.metric)} over time" src="data:image/png;base64,'
                    f'{_chart(s)}">')
    write_text_atomic(html_path, "<!doctype html><html><head><meta charset=utf-8><title>"
                      f"hopperlab history</title><style>{scope.CSS}</style></head>"
                      "<body style='font:14px system-ui'>"
                      + "".join(body) + "</body></html>\n")
    return csv_path, html_path
