"""The node's matmul ceilings read from its own runs (``membench/matmul/bf16`` and ``/fp8``,
``workloads/membench/matmul.py``): each machine's TFLOP per joule, the ceiling of the energy
plausibility gate. Why from the runs: the figure is then the node's that the other runs of the
same results folder landed on, measured with them, not a script's JSON beside them; a machine
without such a run keeps its description's figure (``configs/machines/``: matmul_tflop_per_j).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from hopperlab.core.energy_names import TFLOP_PER_J
from hopperlab.results.machines.descriptions import Figure, MatmulProbe
from hopperlab.results.rows import RunRow

#: the probe runs, by the type they are the ceiling of
PROBE_RUNS = {"bf16": "membench/matmul/bf16", "fp8": "membench/matmul/fp8"}


def _figure(row: RunRow) -> Figure | None:
    value = row.metrics.get(TFLOP_PER_J) if row.status == "ok" else None
    if value is None or value <= 0:
        return None
    return Figure(float(value), f"measured: {row.key} in {row.run_dir} "
                                f"({row.started_at or 'start not recorded'})")


def probes_from_runs(rows: Iterable[RunRow]) -> dict[str, MatmulProbe]:
    """Each machine's probe from its ok ``membench/matmul`` runs (bf16 needed; fp8 beside)."""
    found: dict[str, dict[str, Figure]] = {}
    for row in rows:
        for dtype, key in PROBE_RUNS.items():
            figure = _figure(row) if row.key == key else None
            if figure is not None:
                found.setdefault(row.machine or "unknown", {})[dtype] = figure
    return {machine: MatmulProbe(bf16=f["bf16"], fp8=f.get("fp8"))
            for machine, f in found.items() if "bf16" in f}


def with_measured(described: Mapping[str, MatmulProbe],
                  rows: Iterable[RunRow]) -> dict[str, MatmulProbe]:
    """The descriptions' probes, each machine's own measured one in place where it ran."""
    return {**described, **probes_from_runs(rows)}
