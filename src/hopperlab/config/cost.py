"""A site's price (``cost:`` in configs/sites/<name>.yaml) and what one run cost.

Lives in ``config`` (not ``results``) because the submitting side records the price in the
run's own record (``run/annotate.py``), and ``run`` may not import ``results``. The comparison
(``results/machines/cost.py``) reads the figures recorded here.

``cost_run`` = the run's duration x the hourly rate x its GPUs (``per_gpu_hour``) or nodes
(``per_node_hour``). Each family's cost per unit of work = the hourly rate of the resources the
run held / 3600 / the units per second its own throughput metrics give (``WorkUnit``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from hopperlab.workloads.base import LOWER, WorkUnit

#: the metric every priced run records
COST_RUN = "cost_run"
#: the hourly rate the run was priced at (rate x GPUs or nodes)
COST_RATE = "cost_rate_per_hour"


@dataclass(frozen=True)
class CostSpec:
    """A site's price: exactly one of ``per_gpu_hour`` and ``per_node_hour``, and a currency;
    ``per_kwh`` prices the energy measured, as a line of its own (``cost_energy...``)."""

    per_gpu_hour: float | None = None
    per_node_hour: float | None = None
    currency: str = "USD"
    per_kwh: float | None = None
    #: an example rate, not a price anyone pays (the local site's): every page says so
    example: bool = False

    def __post_init__(self) -> None:
        rates = [r for r in (self.per_gpu_hour, self.per_node_hour) if r is not None]
        if len(rates) != 1:
            raise ValueError("cost: give exactly one of per_gpu_hour and per_node_hour")
        for name in ("per_gpu_hour", "per_node_hour", "per_kwh"):
            rate = getattr(self, name)
            if rate is not None and (isinstance(rate, bool) or not math.isfinite(rate)):
                raise ValueError(f"{name} is {rate!r}: a rate is a finite number")
        if rates[0] < 0 or (self.per_kwh is not None and self.per_kwh < 0):
            raise ValueError("cost: a rate must not be negative")

    @property
    def basis(self) -> str:
        return "gpu" if self.per_gpu_hour is not None else "node"

    def hourly(self, gpus: int, nodes: int) -> float:
        """The hourly rate of what the run held."""
        if self.per_gpu_hour is not None:
            return self.per_gpu_hour * gpus
        return float(self.per_node_hour or 0.0) * nodes


def is_cost_metric(name: str) -> bool:
    return name == COST_RUN or name.startswith(("cost_per_", "cost_energy"))


def cost_direction(name: str) -> str | None:
    """Cheaper is better: every cost metric is ``lower``."""
    return LOWER if is_cost_metric(name) else None


def units_per_s(unit: WorkUnit, metrics: Mapping[str, float],
                params: Mapping[str, Any] | None = None) -> float | None:
    """Units of work per second from the run's final metrics (None when they do not say)."""
    value: float | None = None
    if unit.kind == "per_s":
        value = metrics.get(unit.metric)
        if value is not None and unit.scale_param:
            scale = (params or {}).get(unit.scale_param)
            value = value * scale if isinstance(scale, (int, float)) else None
    elif unit.kind == "ms_each":
        ms = metrics.get(unit.metric)
        value = 1e3 / ms if ms else None
    elif unit.kind in ("sum_per_ms", "count_per_ms"):
        times = [v for k, v in metrics.items() if k.endswith(unit.time_suffix)]
        total_s = sum(times) / 1e3
        if unit.kind == "count_per_ms":
            value = len(times) / total_s if total_s else None
        else:
            done = sum(v for k, v in metrics.items() if k.endswith(unit.metric))
            value = done / total_s if total_s and done else None
    else:
        raise ValueError(f"work unit {unit.name}: unknown kind {unit.kind!r}")
    if value is None or not math.isfinite(value) or value <= 0:
        return None
    return value


def price(metrics: Mapping[str, float], duration_s: float | None, *, cost: CostSpec,
          gpus: int, nodes: int = 1, units: tuple[WorkUnit, ...] = (),
          params: Mapping[str, Any] | None = None) -> tuple[dict[str, float], str | None]:
    """The cost metrics of one run, and a note when some could not be priced (never a zero
    standing in for "unknown")."""
    hourly = cost.hourly(gpus, nodes)
    if hourly <= 0:
        return {}, (f"not priced: the site prices per {cost.basis} hour and the run held "
                    f"no {cost.basis}")
    out = {COST_RATE: hourly}
    notes = []
    if duration_s is not None:
        out[COST_RUN] = duration_s * hourly / 3600
    else:
        notes.append("no duration recorded: no cost_run")
    for unit in units:
        if unit.window:
            continue  # work done outside the run's measured part (the DuckDB peer): energy only
        rate = units_per_s(unit, metrics, params)
        if rate is None:
            continue
        out[unit.name] = hourly / 3600 / rate * unit.size
    return out, "; ".join(notes) or None


def cost_from_mapping(data: Mapping[str, Any] | None) -> CostSpec | None:
    """A CostSpec from a site file's ``cost:`` block or spec.json's (None: not priced)."""
    if not data:
        return None
    return CostSpec(**dict(data))
