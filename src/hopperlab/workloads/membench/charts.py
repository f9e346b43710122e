"""membench's report chart for the collective test: bus bandwidth and time per call over the
message size, one line per variant (log-log), from the per-size metrics each run logs
(``busbw_gbps_<bytes>b``, ``time_us_<bytes>b``). Copy and alloc runs draw nothing here."""

from __future__ import annotations

import re
from typing import Any, Sequence

from hopperlab.workloads.base import FamilyChart

_PER_SIZE = re.compile(r"^(busbw_gbps|time_us)_(\d+)b$")


def curve(metrics: dict[str, float], name: str) -> list[tuple[int, float]]:
    """(bytes, value) of one per-size quantity, by size."""
    points = []
    for key, value in metrics.items():
        m = _PER_SIZE.match(key)
        if m and m.group(1) == name and value is not None and value > 0:
            points.append((int(m.group(2)), float(value)))
    return sorted(points)


def charts(runs: Sequence[Any]) -> list[FamilyChart]:
    lines = [(r.variant, curve(r.metrics, "busbw_gbps"), curve(r.metrics, "time_us"))
             for r in runs]
    lines = [line for line in lines if line[1] or line[2]]
    if not lines:
        return []
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 3.2), dpi=80)
    bw, tm = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for variant, bus, times in lines:
        if bus:
            bw.plot(*zip(*bus), marker=".", label=variant)
        if times:
            tm.plot(*zip(*times), marker=".", label=variant)
    for ax, ylabel in ((bw, "bus bandwidth, GB/s"), (tm, "time per call, us")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message bytes (all-gather: whole output)", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.spines[["top", "right"]].set_visible(False)
    tm.legend(fontsize=7, frameon=False)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.17, wspace=0.3)
    return [FamilyChart(
        title="collectives over message size",
        caption="nccl-tests' bus bandwidth (algbw x 2(n-1)/n for all-reduce, x (n-1)/n for "
                "all-gather) and time per call (the slowest rank's mean) against the message "
                "size, per variant",
        figure=fig)]
