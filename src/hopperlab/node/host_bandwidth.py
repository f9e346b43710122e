"""The host memory bandwidth a job's own CPUs reach: a STREAM-like triad (``a = b + 2c``) in
torch on the threads the job was given.

Why: an optimizer step on the CPU (FSDP2's CPUOffloadPolicy, torchao's CPUOffloadOptimizer)
streams parameters, gradients and AdamW states through host memory; its floor and its
prediction on another machine (Grace's LPDDR5X) need the rate measured where it ran, not a
datasheet's. torch is imported inside the function (login nodes stay quick).
"""

from __future__ import annotations

import math
import time

#: bytes a triad moves per element, in units of the element's size: two reads and one write
TRIAD_TRAFFIC = 3


def triad_gbps(mib_per_array: int = 256, repeats: int = 5) -> float:
    """GB/s of the best of ``repeats`` triads over three float32 arrays of ``mib_per_array``
    MiB each (the first pass touches the pages and is not counted)."""
    import torch

    if mib_per_array <= 0 or repeats <= 0:
        raise ValueError(f"triad_gbps needs a positive size and repeat count, got "
                         f"{mib_per_array} MiB x {repeats}")
    n = mib_per_array * 2**20 // 4
    a = torch.empty(n, dtype=torch.float32)
    b = torch.rand(n, dtype=torch.float32)
    c = torch.rand(n, dtype=torch.float32)
    torch.add(b, c, alpha=2.0, out=a)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.add(b, c, alpha=2.0, out=a)
        best = min(best, time.perf_counter() - t0)
    return TRIAD_TRAFFIC * n * 4 / best / 1e9
