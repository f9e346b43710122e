"""The price side of the comparison: each run's cost per unit of work and "x cheaper per unit".

The figures themselves are recorded with the run (``hopperlab.config.cost``, at the site's
rate); here they are only read and set side by side. ``cheaper`` > 1 means the machine does the
family's unit of work for less than the reference machine (the source's "3-5x cheaper per run").
A run priced in another currency than the reference's is not compared (no exchange rates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from hopperlab.config.cost import COST_RATE, COST_RUN
from hopperlab.core.stats import money
from hopperlab.results import marks
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


def rate_of(row: RunRow) -> tuple[float, str, str, bool] | None:
    """The rate a run was priced at when it was recorded, per GPU or node hour as its site
    prices: (rate, currency, basis, example); None: not priced."""
    hourly = row.metrics.get(COST_RATE)
    basis = row.tags.get("cost.basis", "")
    if hourly is None or not basis:
        return None
    held = row.gpus if "gpu" in basis else row.nodes
    per = hourly / held if held else hourly
    return per, row.tags.get("cost.currency", ""), basis, marks.example_price(row)


def rates_words(machines: Sequence[tuple[str, Iterable[RunRow]]]) -> str:
    """One sentence on the rates the machines' runs were priced at (each its own site's, as
    recorded), and, where every machine has one and the same rate, that the cost ratios are
    then the speed ratios (nothing about the machines' real prices)."""
    seen: dict[str, set[tuple[float, str, str, bool]]] = {}
    for name, rows in machines:
        seen[name] = {(round(r[0], 6), r[1], r[2], r[3]) for row in rows
                      if (r := rate_of(row)) is not None}
    parts = []
    for name, rates in seen.items():
        if not rates:
            parts.append(f"{name} not priced")
            continue
        text = " or ".join(f"{money(rate, cur)} {basis}" + (" (example rate)" if ex else "")
                           for rate, cur, basis, ex in sorted(rates))
        parts.append(f"{name} {text}")
    line = "Prices as each run recorded them, at its own site's rate: " + "; ".join(parts) + "."
    distinct = {r for rates in seen.values() for r in rates}
    if len(seen) > 1 and len(distinct) == 1 and all(seen.values()):
        line += (" One rate for every machine: a cost ratio here is the speed ratio inverted, "
                 "not a difference of price; give each site its own cost block to compare "
                 "prices.")
    return line
