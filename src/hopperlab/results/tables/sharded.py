"""The sharded fine-tune's runs of a results folder as issue 35 judges them: set-up, step, the
floor from the hardware and its parts, the CPU optimizer against its floor and how much of it
the step waited for, host memory (``hopperlab table sharded RESULTS_DIR [--json OUT.json]``;
``--json``: every sharded run's metrics, tags and thread plan, for checking the figures).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hopperlab.results.rows import collect_runs

COLUMNS = (("setup_s", "set-up s"), ("build_s", "build s"), ("build_alloc_s", "alloc s"),
           ("build_init_s", "init s"), ("warmup_s", "warm-up s"),
           ("compile_graphs", "graphs"), ("s_per_iter", "step s"),
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
           ("host_need_gb", "need GB"), ("h2d_prefetch_read", "prefetched"))
#: the profiled step after the measured ones (diagnose_step; step_profile.py): where the GPU's
#: time went, and the copies' rate while the CPU optimizer streamed beside them
DIAG_COLUMNS = (("diag_step_s", "step s"), ("diag_gpu_busy_s", "GPU busy s"),
                ("diag_gpu_idle_s", "GPU idle s"), ("diag_no_compute_s", "no compute s"),
                ("diag_matmul_kernel_s", "matmul s"), ("diag_attention_kernel_s", "attention s"),
                ("diag_triton_kernel_s", "triton s"), ("diag_other_kernel_s", "other kernels s"),
                ("diag_nccl_kernel_s", "NCCL s"), ("diag_nccl_exposed_s", "NCCL exposed s"),
                ("diag_h2d_gb", "h2d GB"), ("diag_h2d_gbps", "h2d GB/s"),
                ("diag_h2d_exposed_s", "h2d exposed s"), ("diag_d2h_gbps", "d2h GB/s"),
                ("diag_d2h_exposed_s", "d2h exposed s"), ("diag_optimizer_s", "CPU optim s"),
                ("diag_optimizer_exposed_s", "optim exposed s"), ("diag_kernels", "kernels"))


def lines(results_dir: Path) -> list[str]:
    """The table's lines: one per sharded run, the profiled step's, each run's tags."""
    runs = [r for r in collect_runs(Path(results_dir)) if "sharded" in r.experiment]
    out = [" | ".join(["run", "status", *(title for _, title in COLUMNS)])]
    for r in runs:
        figures = {**r.metrics, "setup_s": r.setup_s}
        cells = [f"{figures[k]:.4g}" if figures.get(k) is not None else "-" for k, _ in COLUMNS]
        out.append(" | ".join([r.variant, r.status, *cells])
                   + (f"  ({r.reason})" if r.reason else ""))
    profiled = [r for r in runs if "diag_step_s" in r.metrics]
    if profiled:
        out += ["", "the profiled step (diagnose_step, after the measured ones; rank 0)",
                " | ".join(["run", *(title for _, title in DIAG_COLUMNS)])]
        for r in profiled:
            cells = [f"{r.metrics[k]:.4g}" if r.metrics.get(k) is not None else "-"
                     for k, _ in DIAG_COLUMNS]
            out.append(" | ".join([r.variant, *cells]))
    for r in runs:
        tags = {k: v for k, v in r.tags.items()
                if k in ("finetune.compile", "finetune.optimizer_wait", "finetune.step_profile",
                         "finetune.h2d_prefetch", "finetune.reshard_after_forward")}
        if tags:
            out.append(f"{r.variant}: " + "; ".join(f"{k}={v}" for k, v in sorted(tags.items())))
    return out


def figures(results_dir: Path) -> dict[str, Any]:
    """Every sharded run's figures (``--json``)."""
    return {r.variant: {"status": r.status, "reason": r.reason, "setup_s": r.setup_s,
                        "metrics": r.metrics, "tags": r.tags,
                        "threads": r.hardware.get("threads"), "machine": r.machine}
            for r in collect_runs(Path(results_dir)) if "sharded" in r.experiment}
