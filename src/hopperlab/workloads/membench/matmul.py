"""The node's own ceilings as a membench run: a bf16 or fp8 matmul loop on one GPU for
``seconds`` inside the measured window, so that the runner's energy meter gives its joules.

Why a run and not a script: the energy plausibility gate (no model does more work per joule
than a pure matmul loop) and the compute floors need the figure of the node the runs landed
on, from the same results folder (``results/machines/probes.py`` reads it). Without a CUDA
device the run is skipped with the reason: a CPU's matmul is no GPU's ceiling.
"""

from __future__ import annotations

import time
from typing import Any

from hopperlab.core.rundir import SkipRun
from hopperlab.workloads.base import Recording
from hopperlab.workloads.membench import MembenchParams
from hopperlab.workloads.membench.common import Env

#: matmuls launched between two synchronisations
BATCH = 20


def check_matmul(env: Env, params: MembenchParams) -> None:
    """Skip, with the reason, where the probe measures no GPU ceiling."""
    if env.target != "cuda":
        raise SkipRun(f"the matmul probe measures a GPU's ceiling: {env.no_cuda_reason}")
    torch = env.torch
    if params.dtype == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        raise SkipRun(f"fp8 matmul needs compute capability 8.9 or newer; "
                      f"{torch.cuda.get_device_name()} has "
                      f"{'.'.join(map(str, torch.cuda.get_device_capability()))}")


def _matmul(torch: Any, params: MembenchParams) -> Any:
    """One matmul of the probe's type, as a callable."""
    n = params.size
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    if params.dtype == "bf16":
        return lambda: a @ b
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()
    one = torch.ones((), device="cuda", dtype=torch.float32)
    return lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def run_matmul(env: Env, params: MembenchParams, recorder: Recording) -> None:
    """The loop, timed; TFLOP/s and the TFLOP done (its TFLOP per joule follows from the
    window's joules: ``WorkUnit`` cost_per_pflop)."""
    torch = env.torch
    mm = _matmul(torch, params)
    for _ in range(3):
        mm()  # warm-up
    torch.cuda.synchronize()
    iters = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < params.seconds:
        for _ in range(BATCH):
            mm()
        iters += BATCH
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    tflop = 2 * params.size ** 3 * iters / 1e12
    recorder.set_tag("membench.matmul", f"{params.dtype} {params.size}x{params.size}, {iters} "
                                        f"matmuls in {elapsed:.3g} s")
    recorder.log_metrics({"tflops": tflop / elapsed, "measured_tflop": tflop,
                          "matmul_iters": float(iters), "matmul_s": elapsed})
