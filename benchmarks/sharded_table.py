"""The sharded fine-tune's runs of a results folder as the issue judges them: set-up, step,
floor and its parts, host memory (benchmarks/sharded_13b_gpu.sh prints it).

    python benchmarks/sharded_table.py results-13b
"""

from __future__ import annotations

import sys
from pathlib import Path

from hopperlab.results.rows import collect_runs

COLUMNS = (("setup_s", "set-up s"), ("build_s", "build s"), ("s_per_iter", "step s"),
           ("step_floor_s", "floor s"), ("step_over_floor", "step/floor"),
           ("compute_s", "compute s"), ("optimizer_step_s", "optim s"),
           ("link_floor_s", "link s"), ("tokens_per_s", "tokens/s"),
           ("peak_gpu_mem_gb_max", "GPU GB"), ("peak_gpu_mem_gb", "GPU GB 1"),
           ("peak_host_mem_gb", "host RSS GB"), ("pinned_host_peak_gb", "torch pinned GB"),
           ("pinned_exact_gb", "exact pinned GB"), ("params_in_exact_pinned", "in exact"),
           ("host_need_gb", "need GB"))


def main(results_dir: str) -> int:
    runs = [r for r in collect_runs(Path(results_dir)) if "sharded" in r.experiment]
    print(" | ".join(["run", "status", *(title for _, title in COLUMNS)]))
    for r in runs:
        figures = {**r.metrics, "setup_s": r.setup_s}
        cells = [f"{figures[k]:.4g}" if figures.get(k) is not None else "-" for k, _ in COLUMNS]
        print(" | ".join([r.variant, r.status, *cells]) + (f"  ({r.reason})" if r.reason else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "results-13b"))
