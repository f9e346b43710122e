"""The node's pinned host<->device copy bandwidth: the link every host-resident technique is
judged against (offload floors, streamed weights, host-resident queries).

Measured the way membench measures ``copy/h2d-pinned`` and ``copy/d2h-pinned`` (copy engines,
back-to-back ``copy_(non_blocking=True)`` of a page-locked buffer on one stream, CUDA events,
median of a few samples after a warm-up one), at one size large enough to be at the plateau
(docs/benchmarks/membench.md: from 16 MiB up). GB = 1e9 bytes. The families and
the GPU benchmarks measure it in the run itself, so that a floor and the figure it judges come
from the same node and moment.
"""

from __future__ import annotations

import statistics
from typing import Any

from hopperlab.core.stats import GB, MIB

#: the byte the ``verify`` check fills the source with
_MARK = 0x5A


def pinned_copy_gbps(device: Any, direction: str = "h2d", nbytes: int = 256 * MIB,
                     *, copies: int = 1, samples: int = 5, stream: Any = None,
                     host: Any = None, verify: bool = False) -> float:
    """Median GB/s of ``samples`` timed samples (after one untimed) of ``copies`` back-to-back
    copies of ``nbytes`` between page-locked host memory and ``device``.

    ``direction``: "h2d" or "d2h". ``stream``: the CUDA stream to copy on (default: a new one).
    ``host``: a page-locked uint8 tensor of at least ``nbytes`` to use (default: one allocated
    here), e.g. a buffer of the technique being judged. ``verify``: fill the source and check
    that the destination holds it afterwards (a copy that moved nothing would look fast).
    """
    if direction not in ("h2d", "d2h"):
        raise ValueError(f"direction: expected 'h2d' or 'd2h', got {direction!r}")
    import torch

    device = torch.device(device)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) if host is None \
        else host[:nbytes]
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst, src = (dev, host) if direction == "h2d" else (host, dev)
    if verify:
        src.fill_(_MARK)
    stream = stream if stream is not None else torch.cuda.Stream(device)
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
                rates.append(nbytes * copies / (start.elapsed_time(end) / 1e3) / GB)
    if verify and not bool((dst[-4096:] == _MARK).all()):
        raise RuntimeError(f"pinned {direction} copy check failed: the destination lacks the "
                           f"source bytes")
    return float(statistics.median(rates))
