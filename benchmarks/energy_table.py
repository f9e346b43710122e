"""Energy of each run of a results folder, one line each: the table of docs/benchmarks/energy.md.

    python3 benchmarks/energy_table.py RESULTS_DIR

Per run: status, the measured window (s), GPU and host joules, mean and peak GPU power, the
trace/counter agreement, energy per unit of work and work per joule of the family's first unit
(GPU energy; "+host" where the host was measured), and how energy was measured or why not.
Reads the run directories (records), like ``hopperlab report``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hopperlab.config.energy import node_name
from hopperlab.results.rows import collect_runs
from hopperlab.workloads import family_info


def _f(value: float | None, digits: int = 4) -> str:
    return "not measured" if value is None else f"{value:.{digits}g}"


def lines(results: Path) -> list[str]:
    out = ["| run | status | window s | GPU J | host J | GPU W mean / peak | trace/counter | "
           "J per unit (GPU; +host) | work per J | how |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in collect_runs(results):
        m, t = r.metrics, r.tags
        units = [u for u in family_info(r.family).work_units if u.energy_name in m]
        per = work = "not measured"
        if units:
            u = units[0]
            node = m.get(node_name(u))
            per = f"{m[u.energy_name]:.4g} {u.label}" + (f"; {node:.4g} +host" if node else "")
            work = f"{m[u.work_per_j]:.4g} {u.work_label}" if u.work_per_j in m else work
        duck = [x for x in family_info(r.family).work_units
                if x.window and node_name(x) in m]
        if duck:
            per += f"; DuckDB {m[node_name(duck[0])]:.4g} {duck[0].label} (+host)"
        how = "; ".join(f"{k.removeprefix('energy.')}: {v}" for k, v in sorted(t.items())
                        if k.startswith("energy."))
        out.append(f"| {r.key} | {r.status} | {_f(m.get('energy_window_s'))} | "
                   f"{_f(m.get('energy_gpu_j'))} | {_f(m.get('energy_host_j'))} | "
                   f"{_f(m.get('power_gpu_mean_w'))} / {_f(m.get('power_gpu_peak_w'))} | "
                   f"{_f(m.get('energy_gpu_trace_ratio'), 3)} | {per} | {work} | {how} |")
    return out


if __name__ == "__main__":
    print("\n".join(lines(Path(sys.argv[1]))))
