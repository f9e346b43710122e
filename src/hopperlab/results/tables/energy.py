"""Energy of each run of a results folder, one line each: the table of docs/benchmarks/energy.md
(``hopperlab table energy RESULTS_DIR``).

Per run: status, the measured window (s), GPU and host joules, mean and peak GPU power, the
trace/counter agreement, energy per unit of work and work per joule of the family's first unit
(GPU energy; "+host" where the host was measured), the run's model TFLOP per joule against the
node's matmul probe (its ``membench/matmul`` runs in the same folder, else the machine's
description: bf16, fp8 for fp8 runs; more than 10 % above it marks the energy
``implausible``, kept out of the comparisons), and how
energy was measured or why not (how J per unit was divided, slow steps inside the window, why a
trace disagrees with its counter). Two closing lines: runs whose counter and trace agree within
5 %, runs below the probe. Reads the run directories (records), like ``hopperlab report``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from hopperlab.config.energy import node_name, plausibility
from hopperlab.core import energy_names as N
from hopperlab.node.energy.arithmetic import AGREEMENT_MIN_S
from hopperlab.results import correctness
from hopperlab.results.machines.compare import probe_for
from hopperlab.results.machines.descriptions import MatmulProbe
from hopperlab.results.machines.probes import probes_from_runs
from hopperlab.results.rows import collect_runs
from hopperlab.workloads import family_info


def _f(value: float | None, digits: int = 4) -> str:
    return "not measured" if value is None else f"{value:.{digits}g}"


def lines(results: Path, probes: Mapping[str, MatmulProbe] | None = None) -> list[str]:
    """The table's lines; ``probes``: each machine's matmul probe (None: the folder's own
    ``membench/matmul`` runs)."""
    rows = collect_runs(results)
    probes = probes_from_runs(rows) if probes is None else probes
    out = ["| run | status | window s | GPU J | host J | GPU W mean / peak | trace/counter | "
           "J per unit (GPU; +host) | work per J | TFLOP/J (probe) | how |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    agree, disagree, below, margin, above, unmatched = [], [], [], [], [], []
    probed = False
    for r in rows:
        m, t = r.metrics, r.tags
        units = [u for u in family_info(r.family).work_units if u.energy_name in m]
        probe = probe_for(probes, r.machine or "unknown")
        ceiling = probe.ceiling("fp8" in r.key) if probe is not None else None
        probed = probed or ceiling is not None
        gate = plausibility(m, ceiling)
        per = work = "not measured"
        if units:
            u = units[0]
            node = m.get(node_name(u))
            per = f"{m[u.energy_name]:.4g} {u.label}" + (f"; {node:.4g} +host" if node else "")
            work = f"{m[u.work_per_j]:.4g} {u.work_label}" if u.work_per_j in m else work
            if gate:
                per, work = f"implausible ({per})", f"implausible ({work})"
        duck = [x for x in family_info(r.family).work_units
                if x.window and node_name(x) in m]
        if duck:
            per += f"; DuckDB {m[node_name(duck[0])]:.4g} {duck[0].label} (+host)"
        tflop = (m["flops_per_token"] * m["train_tokens_per_j"] / 1e12
                 if "flops_per_token" in m and "train_tokens_per_j" in m else None)
        vs = "-" if tflop is None else f"{tflop:.3g} ({_f(ceiling, 3)})"
        if tflop is not None and ceiling:
            if gate:
                above.append(r.key)
            elif tflop > ceiling:  # above the probe, inside the gate's margin: never "below"
                margin.append(f"{r.key} +{tflop / ceiling - 1:.1%}")
            else:
                below.append(r.key)
        ratio = m.get(N.TRACE_RATIO)
        trace = _f(ratio, 3)
        if ratio is not None:
            (agree if abs(ratio - 1) <= N.TRACE_TOLERANCE else disagree).append(
                f"{r.key} {ratio:.3f}" + (f" ({t[N.TAG_TRACE]})" if N.TAG_TRACE in t else ""))
        elif N.ENERGY_GPU_J in m:  # measured, not compared: say why (a record before the tag too)
            window = m.get(N.ENERGY_WINDOW_S, 0.0)
            why = t.get(N.TAG_TRACE) or (
                f"{N.TRACE_NOT_COMPARED}: the window was {window:.2f} s, under "
                f"{AGREEMENT_MIN_S:g} s" if window < AGREEMENT_MIN_S else
                f"{N.TRACE_NOT_COMPARED}: {t.get(N.TAG_GPU, 'no counter')}")
            trace = f"not compared ({window:.2f} s window)"
            unmatched.append(f"{r.key}: {why}")
        how = "; ".join(f"{k.removeprefix(N.TAG_PREFIX)}: {v}" for k, v in sorted(t.items())
                        if k.startswith(N.TAG_PREFIX))
        if gate:
            how = f"{gate}; " + how
        name = r.key + ("" if correctness.offered(r) else f" ({correctness.NOT_A_FINDING})")
        out.append(f"| {name} | {r.status} | {_f(m.get(N.ENERGY_WINDOW_S))} | "
                   f"{_f(m.get(N.ENERGY_GPU_J))} | {_f(m.get(N.ENERGY_HOST_J))} | "
                   f"{_f(m.get(N.POWER_GPU_MEAN_W))} / {_f(m.get(N.POWER_GPU_PEAK_W))} | "
                   f"{trace} | {per} | {work} | {vs} | {how} |")
    out.append("")
    out.append(f"counter vs trace within {N.TRACE_TOLERANCE:.0%}: {len(agree)} of "
               f"{len(agree) + len(disagree)}" + (f"; outside: {'; '.join(disagree)}"
                                                  if disagree else "")
               + (f"; not compared: {len(unmatched)} ({'; '.join(unmatched)})"
                  if unmatched else ""))
    judged = len(below) + len(margin) + len(above)
    out.append(f"work per joule below the probe's: {len(below)} of {judged}"
               + (f"; above it within the {N.PLAUSIBLE_MARGIN:.0%} margin (a FLOP count or "
                  f"a probe to look at): {', '.join(margin)}" if margin else "")
               + (f"; implausible: {', '.join(above)}" if above else "")
               + ("" if probed else " (no matmul probe of these machines: run "
                                    "membench/matmul into this folder)"))
    return out
