"""A short table of a results folder's runs, for a GPU call's output: status, machine, the
family's headline figures, the reference check and the run's cost.

    python benchmarks/run_table.py results-gpu
"""

from __future__ import annotations

import sys
from pathlib import Path

from hopperlab.results.machines.references import judge_rows
from hopperlab.results.report import build_report
from hopperlab.results.rows import collect_runs


def main(results_dir: str) -> int:
    build_report(Path(results_dir))
    runs = collect_runs(Path(results_dir))
    judge_rows(runs, Path("configs/references"))  # each run against its machine's references
    print(f"{'run':58} {'status':8} {'check':12} {'cost':>8}  headline")
    for r in runs:
        figures = ", ".join(f"{m}={r.metrics[m]:.4g}" for m in r.headline_metrics
                            if m in r.metrics)
        cost = r.metrics.get("cost_run")
        print(f"{r.key:58} {r.status:8} {str(r.reference_check or '-'):12} "
              f"{'-' if cost is None else f'{cost:.4f}':>8}  {figures or r.reason or ''}")
    machines = sorted({r.machine for r in runs if r.machine})
    print(f"machines: {', '.join(machines) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "results-gpu"))
