"""The recommender family's report chart: where each variant's query time goes.

One horizontal stacked bar per variant, a segment per pipeline component (mean latency: means
add up to the end-to-end mean, percentiles do not), labelled with the component's share. It
shows the slides' point: once retrieval and ranking run on the GPU, the CPU feature work and the
transfer are what is left.
"""

from __future__ import annotations

from typing import Any, Sequence

from hopperlab.workloads.base import FamilyChart
from hopperlab.workloads.recommender import COMPONENTS

COLOURS = {"retrieval": "#3f6fb5", "features": "#ef6c00", "transfer": "#8e24aa",
           "ranking": "#2e7d32", "topn": "#90a4ae"}


def latency_breakdown(runs: Sequence[Any]) -> FamilyChart | None:
    from matplotlib.figure import Figure

    rows = [r for r in runs if all(f"lat_{c}_mean_ms" in r.metrics for c in COMPONENTS)]
    if not rows:
        return None
    fig = Figure(figsize=(8.0, 1.0 + 0.4 * len(rows)), dpi=80)
    ax = fig.add_subplot()
    for i, r in enumerate(rows):
        left = 0.0
        total = sum(r.metrics[f"lat_{c}_mean_ms"] for c in COMPONENTS)
        for c in COMPONENTS:
            width = r.metrics[f"lat_{c}_mean_ms"]
            ax.barh(i, width, left=left, color=COLOURS[c], edgecolor="white", linewidth=0.4,
                    label=c if i == 0 else None)
            if total and width / total >= 0.1:
                ax.text(left + width / 2, i, f"{width / total:.0%}", ha="center", va="center",
                        fontsize=7, color="white")
            left += width
        ax.text(left, i, f" {left:.3g} ms", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), [r.variant for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("mean latency per query, ms", fontsize=8)
    ax.legend(ncol=5, fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.subplots_adjust(left=0.25, right=0.9, top=1 - 0.6 / fig.get_size_inches()[1],
                        bottom=0.5 / fig.get_size_inches()[1])
    return FamilyChart(title="latency per component",
                       caption="mean latency of each pipeline component per variant (segment "
                               "labels: share of the end-to-end time)",
                       figure=fig)


def charts(runs: Sequence[Any]) -> list[FamilyChart]:
    chart = latency_breakdown(runs)
    return [chart] if chart is not None else []
