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
from typing import Callable

#: bytes a triad moves per element, in units of the element's size: two reads and one write
TRIAD_TRAFFIC = 3


def triad_gbps(mib_per_array: int = 256, repeats: int = 5, threads: int | None = None,
               start: Callable[[], None] | None = None,
               slowest: Callable[[float], float] | None = None,
               windows: list[tuple[float, float]] | None = None) -> float:
    """GB/s of the best of ``repeats`` triads over three float32 arrays of ``mib_per_array``
    MiB each (the first pass touches the pages and is not counted), on ``threads`` torch
    threads (default: as set; put back after).

    Several processes streaming at once (the ranks of a node, as their optimizer steps do):
    ``start`` runs before each timed pass (a barrier), ``slowest`` turns this process's seconds
    into the slowest one's, so each pass counts only while every process streamed; ``windows``
    collects each timed pass's (start, end) wall-clock times, for checking they overlapped.
    Why ``threads``: a job given N CPUs must be measured on N threads; torch's pool is what a
    launcher's OMP_NUM_THREADS left it (1 under Snakemake before issue 35: 13 GB/s, not 106)."""
    import torch

    if mib_per_array <= 0 or repeats <= 0 or (threads is not None and threads <= 0):
        raise ValueError(f"triad_gbps needs a positive size, repeat count and thread count, got "
                         f"{mib_per_array} MiB x {repeats} on {threads} threads")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        n = mib_per_array * 2**20 // 4
        a = torch.empty(n, dtype=torch.float32)
        b = torch.rand(n, dtype=torch.float32)
        c = torch.rand(n, dtype=torch.float32)
        torch.add(b, c, alpha=2.0, out=a)
        best = math.inf
        for _ in range(repeats):
            if start is not None:
                start()
            w0, t0 = time.time(), time.perf_counter()
            torch.add(b, c, alpha=2.0, out=a)
            seconds, w1 = time.perf_counter() - t0, time.time()
            if windows is not None:
                windows.append((w0, w1))
            best = min(best, slowest(seconds) if slowest is not None else seconds)
    finally:
        torch.set_num_threads(before)
    return TRIAD_TRAFFIC * n * 4 / best / 1e9
