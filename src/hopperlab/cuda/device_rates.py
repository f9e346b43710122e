"""What one GPU does at best, measured on the node the run is on: the rates a floor divides by.

- ``hbm_gbps``: device memory bandwidth as a large device-to-device copy sees it (bytes read
  plus bytes written per second). A decode step reads every weight once, so its floor is bytes
  over this rate.
- ``matmul_tflops``: dense matrix product rate of ``dtype`` at a size large enough to be at the
  plateau (8192 cubed). Prefill is compute bound: its floor is FLOPs over this rate.

Median of a few CUDA-event-timed samples after an untimed one. Measured in the run, not taken
from a data sheet, so that a floor and the figure it judges come from the same GPU and moment
(as ``link.py`` does for the host link). GB = 1e9 bytes, TFLOP = 1e12.
"""

from __future__ import annotations

import statistics
from typing import Any

from hopperlab.core.stats import GB, MIB


def median_event_s(fn: Any, samples: int) -> float:
    """Median seconds of ``fn`` on the current CUDA stream over ``samples`` runs after one
    untimed run, timed by CUDA events (the GPU's time, not the launching thread's)."""
    import torch

    fn()
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def hbm_gbps(device: Any, nbytes: int = 1024 * MIB, samples: int = 5) -> float:
    """GB/s of a ``nbytes`` device-to-device copy, counting the read and the write."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = median_event_s(lambda: dst.copy_(src), samples)
    return 2 * nbytes / seconds / GB  # both buffers are freed on return


def matmul_tflops(device: Any, n: int = 8192, dtype: Any = None, samples: int = 5,
                  repeat: int = 4) -> float:
    """Dense TFLOP/s of ``repeat`` back-to-back [n, n] x [n, n] products in ``dtype``
    (default bfloat16)."""
    import torch

    dtype = dtype or torch.bfloat16
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)

    def products() -> None:
        for _ in range(repeat):
            torch.matmul(a, b, out=out)

    seconds = median_event_s(products, samples)
    return 2 * n ** 3 * repeat / seconds / 1e12
