"""Runs priced when the report is made, at the site's price of now.

The price is no part of a run's fingerprint (issue 28 item 5): a changed rate must not rerun
anything, so the figures the submitting side recorded may be of an older rate. ``reprice``
replaces them with the current site's, from each run's duration, the GPUs or nodes its spec
held and its own throughput metrics.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from hopperlab.config.cost import COST_RATE, CostSpec, is_cost_metric, price
from hopperlab.core import rundir
from hopperlab.results.rows import RunRow
from hopperlab.workloads import family_info

#: record tags that say how a run was priced
COST_TAGS = ("cost.currency", "cost.basis", "cost.note")


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
        if note:
            row.tags["cost.note"] = note
