"""A second process that loads the GPU for part of the time: the "real slowdown" of issue 29.

While the flag file exists, every ``period`` it keeps the GPU's copy engines busy with pinned
host->device copies for ``duty`` of the period, then its SMs with bf16 matmuls for ``duty`` of
the period, then sleeps: a run sharing the GPU loses about ``duty`` of its link or its compute
(time-sliced contexts). How much it really lost is measured, not assumed: noise_gpu.py reports
each run's loaded median over its healthy one. Without the flag it idles with its context up.

    python3 benchmarks/gpu_loader.py FLAG [--duty 0.1] [--period-ms 50]
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("flag")
    ap.add_argument("--duty", type=float, default=0.10)
    ap.add_argument("--period-ms", type=float, default=50.0)
    args = ap.parse_args()
    import torch

    dev = torch.device("cuda")
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    host = torch.empty(64 << 20, dtype=torch.uint8).pin_memory()
    dst = torch.empty_like(host, device=dev)
    torch.cuda.synchronize()
    period, busy = args.period_ms / 1e3, args.duty * args.period_ms / 1e3
    while True:
        if not os.path.exists(args.flag):
            time.sleep(0.005)
            continue
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < busy:          # the link
            dst.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        while time.perf_counter() - t1 < busy:          # the SMs
            torch.matmul(a, b)
            torch.cuda.synchronize()
        rest = period - (time.perf_counter() - t0)
        if rest > 0:
            time.sleep(rest)


if __name__ == "__main__":
    main()
