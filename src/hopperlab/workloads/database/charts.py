"""The database family's report chart: per query, the time of each placement (dots on a log
scale), the link-bound floor of each host-resident variant, and DuckDB's time on the same node.

It shows the slides' point at a glance: host-resident variants sit on their floor (the link is
the bottleneck), and only fewer bytes (compact columns) or a faster link move them under DuckDB.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from hopperlab.workloads.base import FamilyChart, frame_variants
from hopperlab.workloads.database import QUERIES


def _values(runs: Sequence[Any], name: str) -> list[float | None]:
    return [r.metrics.get(name) for r in runs]


def query_chart(runs: Sequence[Any], query: str) -> FamilyChart | None:
    """One query's chart, or None when no run measured it."""
    from matplotlib.figure import Figure

    times = _values(runs, f"{query}_time_ms")
    if not any(t is not None for t in times):
        return None
    floors = _values(runs, f"{query}_floor_ms")
    duckdb = [v for v in _values(runs, f"{query}_duckdb_ms") if v is not None]
    correct = _values(runs, f"{query}_correct")
    fig = Figure(figsize=(max(5.0, 0.7 * len(runs) + 1.5), 3.0), dpi=80)
    ax = fig.add_subplot()
    # dots, not bars: on a log axis a bar's length depends on where the axis is cut
    for i, (t, ok) in enumerate(zip(times, correct)):
        if t is None:
            continue
        colour = "#3f6fb5" if ok != 0 else "#c62828"
        ax.plot([i], [t], "o", color=colour, markersize=6, zorder=3)
        ax.annotate(f"{t:.3g}" + ("" if ok != 0 else " WRONG"), (i, t), xytext=(0, 5),
                    textcoords="offset points", ha="center", fontsize=7, color=colour)
    drawn = []
    floor_label = "link floor"
    for i, f in enumerate(floors):
        if f is not None and f > 0:
            ax.hlines(f, i - 0.35, i + 0.35, colors="black", linewidth=1.6, label=floor_label)
            floor_label = None
    if floor_label is None:
        drawn.append("black ticks: bytes read / measured pinned bandwidth (the link floor)")
    if duckdb:
        ax.axhline(statistics.median(duckdb), color="#ef6c00", linestyle="--", linewidth=1,
                   label="DuckDB (all cores)")
        drawn.append("dashed: DuckDB")
    ax.set_yscale("log")
    ax.margins(y=0.25)
    ax.grid(axis="y", which="both", color="#eceff1", linewidth=0.6, zorder=0)
    # the unit in the title: a y label collided with the log axis' tick labels
    ax.set_title(f"TPC-H {query.upper()}: ms per query (median), log scale", fontsize=9)
    if drawn:
        ax.legend(fontsize=7, frameon=False)
    frame_variants(fig, ax, [r.variant for r in runs])
    wrong = any(ok == 0 for ok in correct)
    return FamilyChart(
        title=f"{query} time per placement",
        caption=f"{query.upper()}: time per variant, one dot each (log scale"
                + ("; red: answer differs from DuckDB" if wrong else
                   "; every answer matched DuckDB's")
                + ")" + "".join(f", {d}" for d in drawn),
        figure=fig)


def charts(runs: Sequence[Any]) -> list[FamilyChart]:
    out = []
    for query in QUERIES:
        chart = query_chart(runs, query)
        if chart is not None:
            out.append(chart)
    return out
