"""The sharded fine-tune's runs of a results folder as issue 35 judges them: set-up, step, the
floor from the hardware and its parts, the CPU optimizer against its floor and how much of it
the step waited for, host memory (benchmarks/sharded_13b_gpu.sh prints it).

    python benchmarks/sharded_table.py results-13b [--json OUT.json]

``--json``: every sharded run's metrics, tags and thread plan, for checking the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hopperlab.results.rows import collect_runs

COLUMNS = (("setup_s", "set-up s"), ("build_s", "build s"), ("s_per_iter", "step s"),
           ("step_floor_s", "floor s"), ("step_over_floor", "step/floor"),
           ("floor_overlapped", "overlapped"), ("floor_compute_s", "compute floor s"),
           ("compute_measured_s", "compute measured s"), ("matmul_tflops", "matmul TFLOP/s"),
           ("link_floor_s", "link s"), ("floor_optimizer_s", "CPU optim floor s"),
           ("optimizer_step_s", "CPU optim s"), ("optimizer_over_floor", "optim/floor"),
           ("optimizer_exposed_s", "exposed s"), ("host_triad_gbps", "node triad GB/s"),
           ("host_triad_threads", "triad threads"), ("torch_threads", "torch threads"),
           ("tokens_per_s", "tokens/s"), ("peak_gpu_mem_gb_max", "GPU GB"),
           ("peak_gpu_mem_gb", "GPU GB 1"), ("peak_host_mem_gb", "host RSS GB"),
           ("pinned_host_peak_gb", "torch pinned GB"), ("pinned_exact_gb", "exact pinned GB"),
           ("host_need_gb", "need GB"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir", nargs="?", default="results-13b")
    ap.add_argument("--json", help="write every sharded run's figures here")
    args = ap.parse_args(argv)
    runs = [r for r in collect_runs(Path(args.results_dir)) if "sharded" in r.experiment]
    print(" | ".join(["run", "status", *(title for _, title in COLUMNS)]))
    for r in runs:
        figures = {**r.metrics, "setup_s": r.setup_s}
        cells = [f"{figures[k]:.4g}" if figures.get(k) is not None else "-" for k, _ in COLUMNS]
        print(" | ".join([r.variant, r.status, *cells]) + (f"  ({r.reason})" if r.reason else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {r.variant: {"status": r.status, "reason": r.reason, "setup_s": r.setup_s,
                         "metrics": r.metrics, "tags": r.tags,
                         "threads": r.hardware.get("threads"), "machine": r.machine}
             for r in runs}, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
