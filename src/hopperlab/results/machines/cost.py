"""The price side of the comparison: each run's cost per unit of work and "x cheaper per unit".

The figures themselves are recorded with the run (``hopperlab.config.cost``, at the site's
rate); here they are only read and set side by side. ``cheaper`` > 1 means the machine does the
family's unit of work for less than the reference machine (the source's "3-5x cheaper per run").
A run priced in another currency than the reference's is not compared (no exchange rates).
"""

from __future__ import annotations

from dataclasses import dataclass

from hopperlab.config.cost import COST_RUN
from hopperlab.results.rows import RunRow
from hopperlab.workloads import family_info


@dataclass(frozen=True)
class UnitCost:
    metric: str      # e.g. cost_per_1m_train_tokens
    label: str       # e.g. per 1M training tokens
    value: float
    currency: str


def unit_costs(row: RunRow) -> list[UnitCost]:
    """The run's recorded cost per unit of each of its family's work units."""
    try:
        units = family_info(row.family).work_units
    except (KeyError, ImportError):
        return []
    currency = row.tags.get("cost.currency", "")
    return [UnitCost(u.name, u.label, row.metrics[u.name], currency)
            for u in units if u.name in row.metrics]


def run_cost(row: RunRow) -> float | None:
    return row.metrics.get(COST_RUN)


def cheaper(reference: UnitCost | None, this: UnitCost | None) -> float | None:
    """How many times cheaper per unit ``this`` is than ``reference`` (None: not comparable)."""
    if reference is None or this is None or this.value <= 0:
        return None
    if reference.currency != this.currency:
        return None
    return reference.value / this.value


def cheaper_words(times: float, same_within: float = 0.0) -> str:
    """``1.15x cheaper`` or ``costs 1.15x more`` (``times`` < 1), never "0.87x cheaper"."""
    if abs(times - 1.0) < same_within or times == 1.0:
        return "the same cost"
    return f"{times:.2f}x cheaper" if times > 1 else f"costs {1 / times:.2f}x more"
