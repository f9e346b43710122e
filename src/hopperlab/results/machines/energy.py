"""Energy side by side: each run's energy per unit of work, "x less energy per unit", and the
energy line of a prediction (predicted time x the target's module power, labelled, with inputs).

Measured figures are the run's own (``config.energy``, recorded with the run). The comparison
uses GPU energy per unit, the figure every machine with NVML has; the node figure (GPU + host)
is shown beside it where the host was measured. A prediction's energy is an upper bound: the
whole module at the power its description cites, for the predicted time of one unit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from hopperlab.config.cost import units_per_s
from hopperlab.config.energy import node_name, plausibility
from hopperlab.results.machines.descriptions import MachineDescription, MatmulProbe
from hopperlab.results.rows import RunRow
from hopperlab.workloads import family_info
from hopperlab.workloads.base import WorkUnit


@dataclass(frozen=True)
class UnitEnergy:
    metric: str           # energy_per_1m_train_tokens_j
    label: str            # per 1M training tokens
    joules: float         # GPU energy per unit
    node_joules: float | None = None  # GPU + host, where the host was measured
    work_per_j: float | None = None
    work_label: str = ""
    #: "implausible: ..." (``config.energy.plausibility`` against the machine's matmul probe):
    #: shown, never compared
    implausible: str | None = None


def _units(family: str) -> tuple[WorkUnit, ...]:
    try:
        return family_info(family).work_units
    except (KeyError, ImportError):
        return ()


def unit_energy(row: RunRow, probe: MatmulProbe | None = None) -> UnitEnergy | None:
    """The run's energy per unit of its family's first unit it measured (None: none), marked
    implausible where its work per joule beats the machine's matmul ``probe`` (issue 36)."""
    ceiling = probe.ceiling("fp8" in row.key) if probe is not None else None
    gate = plausibility(row.metrics, ceiling)
    for u in _units(row.family):
        if u.window or u.energy_name not in row.metrics:
            continue
        return UnitEnergy(u.energy_name, u.label, row.metrics[u.energy_name],
                          row.metrics.get(node_name(u)),
                          row.metrics.get(u.work_per_j) if u.work_per_j else None, u.work_label,
                          gate)
    return None


def less_energy(reference: UnitEnergy | None, this: UnitEnergy | None) -> float | None:
    """How many times less energy per unit ``this`` uses than ``reference``."""
    if reference is None or this is None or this.joules <= 0 or reference.metric != this.metric:
        return None
    if reference.implausible or this.implausible:  # kept out of comparisons
        return None
    return reference.joules / this.joules


@dataclass
class PredictedEnergy:
    joules: float | None
    label: str = ""
    formula: str = ""
    inputs: dict[str, str] | None = None
    measured: float | None = None
    unpredictable: str | None = None

    @property
    def error(self) -> float | None:
        if self.joules is None or not self.measured:
            return None
        return (self.joules - self.measured) / self.measured


def _unit_of(family: str, metric: str) -> WorkUnit | None:
    """The family's unit whose throughput the predicted metric is."""
    for u in _units(family):
        if u.window:
            continue
        if u.kind in ("per_s", "ms_each") and u.metric == metric:
            return u
        if u.kind == "count_per_ms" and metric.endswith(u.time_suffix):
            return u
    return None


def predict_energy(family: str, metric: str, predicted: float | None, target: MachineDescription,
                   params: Mapping[str, Any], measured: RunRow | None = None
                   ) -> PredictedEnergy:
    """Energy per unit on ``target``: its module power x the predicted time of one unit."""
    power = target.module_power_w
    if power is None or power.value is None:
        return PredictedEnergy(None, unpredictable=f"{target.name} cites no module power "
                                                    "(module_power_w)")
    unit = _unit_of(family, metric)
    if unit is None:
        return PredictedEnergy(None, unpredictable=f"{metric} is not the throughput of a unit of "
                                                   f"{family}'s work")
    if predicted is None:
        return PredictedEnergy(None, unpredictable="no predicted time")
    rate = units_per_s(unit, {metric: predicted}, params)
    if rate is None:
        return PredictedEnergy(None, unpredictable=f"{metric} gives no units per second")
    joules = float(power.value) / rate * unit.size
    out = PredictedEnergy(
        joules, f"J {unit.label} (PREDICTION, upper bound)",
        f"E = P_module / units_per_s({metric}') x {unit.size:g}",
        {"P_module": f"{power.value:g} W ({target.name} module_power_w: {power.source})",
         f"{metric}'": f"{predicted:.6g} (predicted)"})
    if measured is not None and measured.status == "ok":
        out.measured = measured.metrics.get(node_name(unit), measured.metrics.get(
            unit.energy_name))
    return out
