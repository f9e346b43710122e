"""A short table of a results folder's runs, for a GPU call's output: status, machine, the
family's headline figures, the reference check and the run's cost
(``hopperlab table runs RESULTS_DIR``).
"""

from __future__ import annotations

from pathlib import Path

from hopperlab.results import correctness
from hopperlab.results.machines.references import judge_rows
from hopperlab.results.report import build_report
from hopperlab.results.rows import collect_runs


def lines(results_dir: Path, refs_dir: Path) -> list[str]:
    """The table's lines (the report is rebuilt on the way, as before)."""
    build_report(Path(results_dir))
    runs = collect_runs(Path(results_dir))
    judge_rows(runs, refs_dir)  # each run against its machine's references
    out = [f"{'run':58} {'status':8} {'check':12} {'cost':>8}  headline"]
    for r in runs:
        figures = ", ".join(f"{m}={r.metrics[m]:.4g}" for m in r.headline_metrics
                            if m in r.metrics)
        if not correctness.offered(r):  # another computation: its figures are no finding
            figures += f"  [{correctness.NOT_A_FINDING}]"
        cost = r.metrics.get("cost_run")
        out.append(f"{r.key:58} {r.status:8} {str(r.reference_check or '-'):12} "
                   f"{'-' if cost is None else f'{cost:.4f}':>8}  {figures or r.reason or ''}")
    machines = sorted({r.machine for r in runs if r.machine})
    out.append(f"machines: {', '.join(machines) or '-'}")
    return out
