"""Energy per unit of work, work per joule, and the energy's price, from a run's record.

The job measures joules over its measured window (``node/energy``); the submitting side divides
by the family's units of work (``WorkUnit``, the same units cost uses): energy per unit = the
window's mean power / the units per second its throughput metrics give x the unit's size. GPU
energy gives ``energy_per_...``; GPU plus host (where the host was measured) gives
``energy_node_per_...``; work per joule (``WorkUnit.work_per_j``) is of GPU energy. A figure
that was not measured is absent (the report says "not measured"), never 0.
"""

from __future__ import annotations

from typing import Any, Mapping

from hopperlab.config.cost import CostSpec, units_per_s
from hopperlab.workloads.base import HIGHER, LOWER, WorkUnit

ENERGY_GPU = "energy_gpu_j"
ENERGY_HOST = "energy_host_j"
ENERGY_WINDOW = "energy_window_s"
#: the measured window's energy (GPU, plus host where measured) at the site's ``per_kwh``
COST_ENERGY = "cost_energy"
J_PER_KWH = 3.6e6
NOT_MEASURED = "not measured"


def node_name(unit: WorkUnit) -> str:
    """``cost_per_1k_queries`` -> ``energy_node_per_1k_queries_j`` (GPU + host)."""
    return "energy_node" + unit.name[len("cost"):] + "_j"


def energy_price_name(unit: WorkUnit) -> str:
    """``cost_per_1m_train_tokens`` -> ``cost_energy_per_1m_train_tokens``."""
    return COST_ENERGY + unit.name[len("cost"):]


def _window(metrics: Mapping[str, float], window: str) -> tuple[float | None, float | None,
                                                                float | None]:
    prefix = f"{window}_" if window else ""
    return (metrics.get(prefix + ENERGY_WINDOW), metrics.get(prefix + ENERGY_GPU),
            metrics.get(prefix + ENERGY_HOST))


def energy_figures(metrics: Mapping[str, float], units: tuple[WorkUnit, ...],
                   params: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Energy per unit and work per joule of every unit the run's metrics can give."""
    out: dict[str, float] = {}
    for unit in units:
        seconds, gpu, host = _window(metrics, unit.window)
        rate = units_per_s(unit, metrics, params)
        if not rate or not seconds or seconds <= 0:
            continue
        if gpu is not None and gpu > 0:
            power = gpu / seconds
            out[unit.energy_name] = power / rate * unit.size
            if unit.work_per_j:
                out[unit.work_per_j] = rate / power / unit.work_scale
        if gpu is not None and host is not None and gpu + host > 0:
            out[node_name(unit)] = (gpu + host) / seconds / rate * unit.size
    return out


def energy_cost(metrics: Mapping[str, float], cost: CostSpec,
                units: tuple[WorkUnit, ...]) -> dict[str, float]:
    """The energy's price: the window's and each unit's (node energy where the host was
    measured, else GPU energy), at ``cost.per_kwh``; nothing when the site sets none."""
    if cost.per_kwh is None:
        return {}
    out: dict[str, float] = {}
    _, gpu, host = _window(metrics, "")
    if gpu is not None:
        out[COST_ENERGY] = (gpu + (host or 0.0)) / J_PER_KWH * cost.per_kwh
    for unit in units:
        joules = metrics.get(node_name(unit), metrics.get(unit.energy_name))
        if joules is not None:
            out[energy_price_name(unit)] = joules / J_PER_KWH * cost.per_kwh
    return out


def energy_scope(metrics: Mapping[str, float]) -> str:
    """What ``cost_energy`` and the node figures count: "gpu+host", "gpu" or not measured."""
    if ENERGY_GPU not in metrics:
        return NOT_MEASURED
    return "gpu+host" if ENERGY_HOST in metrics else "gpu"


def energy_direction(name: str) -> str | None:
    """Less energy per unit is better, more work per joule is better; None: not an energy
    figure of work."""
    if name.startswith(("energy_per_", "energy_node_per_")):
        return LOWER
    if name.endswith("_per_j"):
        return HIGHER
    return None
