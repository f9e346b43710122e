"""Energy per unit of work, work per joule, and the energy's price, from a run's record.

The job measures joules over its measured window (``node/energy``); the submitting side divides
by the family's units of work (``WorkUnit``, the same units cost uses): energy per unit = the
window's joules / the units of work completed inside the window (``WorkUnit.done``, issue 36: a
stall inside the window is paid for, not hidden by a p50 rate), else, for a unit that does not
say, the window's mean power / the units per second its throughput metrics give (tag
``energy.basis`` says which). GPU
energy gives ``energy_per_...``; GPU plus host (where the host was measured) gives
``energy_node_per_...``; work per joule (``WorkUnit.work_per_j``) is of GPU energy. A figure
that was not measured is absent (the report says "not measured"), never 0.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from hopperlab.config.cost import CostSpec, units_per_s
from hopperlab.core import energy_names as N
from hopperlab.workloads.base import HIGHER, LOWER, WorkUnit

ENERGY_GPU = N.ENERGY_GPU_J
ENERGY_HOST = N.ENERGY_HOST_J
ENERGY_WINDOW = N.ENERGY_WINDOW_S
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


def work_done(unit: WorkUnit, metrics: Mapping[str, float],
              params: Mapping[str, Any] | None = None) -> float | None:
    """The units of work completed inside the unit's window(s) (the measured one, or its own
    ``window``: the DuckDB peer's queries in window ``duckdb``): the product of the unit's
    ``done`` metrics, x its ``scale_param``; None when the unit does not say or a figure is
    missing."""
    if not unit.done:
        return None
    value = 1.0
    for name in unit.done:
        figure = metrics.get(name)
        if figure is None or not math.isfinite(figure) or figure <= 0:
            return None
        value *= figure
    if unit.scale_param:
        scale = (params or {}).get(unit.scale_param)
        if not isinstance(scale, (int, float)):
            return None
        value *= scale
    return value


def energy_figures(metrics: Mapping[str, float], units: tuple[WorkUnit, ...],
                   params: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Energy per unit and work per joule of every unit the run's metrics can give: joules over
    the work done inside the window where the unit says what that is, else mean power over
    the rate."""
    out: dict[str, float] = {}
    for unit in units:
        seconds, gpu, host = _window(metrics, unit.window)
        if not seconds or seconds <= 0:
            continue
        done = work_done(unit, metrics, params)
        rate = done / seconds if done else units_per_s(unit, metrics, params)
        if not rate:
            continue
        if gpu is not None and gpu > 0:
            power = gpu / seconds
            out[unit.energy_name] = power / rate * unit.size
            if unit.work_per_j:
                out[unit.work_per_j] = rate / power / unit.work_scale
        if gpu is not None and host is not None and gpu + host > 0:
            out[node_name(unit)] = (gpu + host) / seconds / rate * unit.size
    return out


def energy_basis(metrics: Mapping[str, float], units: tuple[WorkUnit, ...],
                 params: Mapping[str, Any] | None = None, why: str | None = None) -> str:
    """How the first unit's J per unit was divided (tag ``energy.basis``); ``why``: the run's
    own reason its work was not counted (tag ``energy.work_not_counted``), said with the rate."""
    usable = [u for u in units if not u.window]
    # the unit the run's own metrics give (a family of several units: membench's copies and
    # its matmul probe), else the first
    unit = next((u for u in usable if work_done(u, metrics, params)
                 or units_per_s(u, metrics, params)), usable[0] if usable else None)
    if unit is None:
        return f"no unit of work{f'; {why}' if why else ''}"
    done = work_done(unit, metrics, params)
    if done:
        return (f"work done: {done:.6g} units inside the window ({' x '.join(unit.done)}); "
                f"J per unit = window joules / work done")
    because = f"; work done not counted: {why}" if why else ""
    return (f"rate: the window's mean power over {unit.metric or unit.kind} (the p50 "
            f"figure){because}")


def plausibility(metrics: Mapping[str, float], probe_tflop_per_j: float | None,
                 duration_s: float | None = None) -> str | None:
    """``implausible: ...`` when the run's model FLOP per joule (``flops_per_token`` x training
    tokens per joule) beats the node's own matmul probe by more than ``PLAUSIBLE_MARGIN``: no
    model does more work per joule than a pure matmul loop, so the joules or the work are
    wrong (a window that is not the work). None: plausible, or nothing to compare."""
    flop = metrics.get("flops_per_token")
    per_j = metrics.get("train_tokens_per_j")
    if not probe_tflop_per_j or not flop or not per_j:
        return None
    run = flop * per_j / 1e12
    if run > probe_tflop_per_j * (1 + N.PLAUSIBLE_MARGIN):
        return (f"implausible: {run:.3g} TFLOP per joule, above the node's matmul probe's "
                f"{probe_tflop_per_j:.3g} by {run / probe_tflop_per_j - 1:.0%} (> "
                f"{N.PLAUSIBLE_MARGIN:.0%}); kept out of comparisons")
    return None


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
