"""The co-runner of benchmarks/noise_gpu.py: a second process that takes a controlled share of
the GPU while the flag file exists (issue 36; the loader of issue 29 slowed GPU-bound runs by
0.1 %: it was switched on after their windows had ended).

Every ``period`` it is busy for ``duty`` of the period, then sleeps. Busy means, by mode:
``sm``: its own bf16 matmuls back to back (time-sliced against the run's kernels, the run loses
about that share of the SMs); ``h2d`` / ``d2h``: pinned copies in that direction (the run shares
the link). The controller (noise_gpu.py) writes the mode to ``FLAG.mode`` and the duty to
``FLAG.duty`` and tunes the duty from the run's measured slowdown; clocks and power limits are
never touched. Without the flag it idles with its context and buffers up.

    python3 benchmarks/gpu_loader.py FLAG [--period-ms 20]
"""

from __future__ import annotations

import argparse
import os
import time


def _read(path: str, default: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip() or default
    except OSError:
        return default


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("flag")
    ap.add_argument("--period-ms", type=float, default=20.0)
    args = ap.parse_args()
    import torch

    dev = torch.device("cuda")
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    host = torch.empty(16 << 20, dtype=torch.uint8).pin_memory()
    dev_buf = torch.empty(host.shape, dtype=torch.uint8, device=dev)
    ops = {"sm": lambda: torch.matmul(a, b),
           "h2d": lambda: dev_buf.copy_(host, non_blocking=True),
           "d2h": lambda: host.copy_(dev_buf, non_blocking=True)}
    torch.cuda.synchronize()
    period = args.period_ms / 1e3
    while True:
        if not os.path.exists(args.flag):
            time.sleep(0.002)
            continue
        op = ops.get(_read(args.flag + ".mode", "sm"), ops["sm"])
        duty = min(1.0, max(0.0, float(_read(args.flag + ".duty", "0.2"))))
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < duty * period:
            op()
            torch.cuda.synchronize()
        rest = period - (time.perf_counter() - t0)
        if rest > 0:
            time.sleep(rest)


if __name__ == "__main__":
    main()
