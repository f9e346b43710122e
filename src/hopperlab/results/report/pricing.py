"""A what-if: runs priced when the report is made, at another rate than they recorded.

A run is priced once, when it is recorded, at its own site's rate (``run/annotate.py``); every
page reads that figure. The price is no part of a run's fingerprint (issue 28 item 5), so a
changed rate reruns nothing: ``hopperlab report --what-if-price`` prices the runs at the
current site's rate into files of their own that say so (issue 49: the report re-priced every
run at the local example rate and disagreed with metrics.json and machines.html by 25-50x).
``reprice`` works from each run's duration, the GPUs or nodes its spec held and its own
throughput metrics.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from hopperlab.config.cost import COST_RATE, CostSpec, is_cost_metric, price
from hopperlab.core import rundir
from hopperlab.core.stats import money
from hopperlab.results.rows import RunRow
from hopperlab.workloads import family_info

#: record tags that say how a run was priced
COST_TAGS = ("cost.currency", "cost.basis", "cost.note", "cost.example", "cost.what_if")


def what_if_words(cost: CostSpec) -> str:
    """``$2.49 per gpu hour (an example rate)``: the rate a what-if prices at."""
    rate = cost.per_gpu_hour if cost.per_gpu_hour is not None else cost.per_node_hour
    return (f"{money(float(rate or 0.0), cost.currency)} per {cost.basis} hour"
            + (" (an example rate)" if cost.example else ""))


def _spec(row: RunRow) -> Mapping[str, Any]:
    try:
        data = rundir.read_json(row.run_dir / rundir.SPEC_FILE)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, Mapping) else {}


def _count(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else default


def reprice(runs: Iterable[RunRow], cost: CostSpec | None) -> None:
    """Replace each run's cost metrics and tags with those of ``cost`` (None: the site has no
    price now, so no run is priced)."""
    for row in runs:
        row.metrics = {k: v for k, v in row.metrics.items()
                       if not (is_cost_metric(k) or k == COST_RATE)}
        row.tags = {k: v for k, v in row.tags.items() if k not in COST_TAGS}
        if cost is None:
            continue
        spec = _spec(row)
        res = spec.get("resources") if isinstance(spec.get("resources"), Mapping) else {}
        params = spec.get("params") if isinstance(spec.get("params"), Mapping) else {}
        try:
            units = family_info(row.family).work_units
        except (KeyError, ImportError, ValueError):
            units = ()
        figures, note = price(row.metrics, row.duration_s, cost=cost,
                              gpus=_count(res.get("gpus"), 0), nodes=_count(res.get("nodes"), 1),
                              units=units, params=params)
        row.metrics.update(figures)
        row.tags["cost.currency"] = cost.currency
        row.tags["cost.basis"] = f"per {cost.basis} hour"
        row.tags["cost.what_if"] = what_if_words(cost)
        if cost.example:
            row.tags["cost.example"] = "true"
        if note:
            row.tags["cost.note"] = note
