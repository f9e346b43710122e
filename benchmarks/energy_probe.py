"""The energy meter on its own, on this node: a bf16 matmul loop of ``--seconds`` inside
``measured_region()`` under the runner's meter (NVML counter at the edges, 10 Hz trace).

    python3 benchmarks/energy_probe.py --seconds 3 [--size 8192] [--dtype bf16|fp8]

Prints the figures as JSON: the window, GPU joules and where they came from, mean and peak
power, the trace/counter ratio (the issue's check: within 5 % on windows of 2 s or more), TFLOP/s
and TFLOP per joule (the plausibility gate's ceiling: benchmarks/energy_table.py --probe), and the
GPU state at start and end. ``--dtype fp8``: e4m3 inputs through ``torch._scaled_mm`` (the
ceiling of fp8 runs). Without CUDA it multiplies bf16 on the CPU (small) and says what could not
be measured.
"""

from __future__ import annotations

import argparse
import json
import time

from hopperlab.core import energy_names as N
from hopperlab.core.window import listening
from hopperlab.cuda.nvtx import measured_region
from hopperlab.node.energy.meter import open_meter


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16")
    args = ap.parse_args()
    import torch

    cuda = torch.cuda.is_available()
    n = args.size if cuda else 256
    dev = "cuda" if cuda else "cpu"
    dtype = args.dtype if cuda else "bf16"
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    if dtype == "fp8":
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()
        one = torch.ones((), device=dev, dtype=torch.float32)

        def mm():
            return torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        def mm():
            return a @ b
    for _ in range(3):
        mm()  # warm-up
    meter = open_meter(per_rank=False, measure_host=True)
    iters = 0
    with listening(meter.listener):
        meter.start()
        time.sleep(0.5)  # idle before the window: the trace shows the step
        with measured_region():
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < args.seconds:
                for _ in range(20):
                    mm()
                iters += 20
                if cuda:
                    torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0
        time.sleep(0.5)
    res = meter.finish()
    tflop = 2 * n**3 * iters / 1e12
    out = {"device": torch.cuda.get_device_name() if cuda else "cpu", "dtype": dtype, "n": n,
           "iters": iters,
           "seconds": elapsed, "tflops": tflop / elapsed, **res.metrics, **res.tags,
           "gpu_state": res.gpu_state}
    if N.ENERGY_GPU_J in res.metrics:
        out[N.TFLOP_PER_J] = tflop / res.metrics[N.ENERGY_GPU_J]
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
