"""The node's pinned host->device copy bandwidth: the link a host-resident query cannot beat.

Measured the way membench measures ``copy/h2d-pinned`` (copy engines, back-to-back
``copy_(non_blocking=True)`` of a page-locked buffer on one stream, CUDA events, median of a few
samples), at one size large enough to be at the plateau (256 MiB; membench's sweep on the lent
H200 reached it from 16 MiB up). GB = 1e9 bytes.
"""

from __future__ import annotations

import statistics

import torch

MIB = 2**20


def pinned_h2d_gbps(device: torch.device, size_mb: int = 256, copies: int = 4,
                    samples: int = 3) -> float:
    """Median GB/s of ``samples`` timed samples of ``copies`` back-to-back pinned H2D copies."""
    n = size_mb * MIB
    src = torch.empty(n, dtype=torch.uint8, pin_memory=True).fill_(0x5A)
    dst = torch.empty(n, dtype=torch.uint8, device=device)
    stream = torch.cuda.Stream(device)
    rates = []
    with torch.cuda.stream(stream):
        for i in range(samples + 1):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(copies):
                dst.copy_(src, non_blocking=True)
            end.record(stream)
            end.synchronize()
            if i > 0:  # the first sample is a warm-up
                rates.append(n * copies / (start.elapsed_time(end) / 1e3) / 1e9)
    if not bool((dst[-4096:] == 0x5A).all()):
        raise RuntimeError("pinned copy check failed: the device buffer lacks the source bytes")
    return float(statistics.median(rates))
