"""The energy meter on its own, on this node: a bf16 matmul loop of ``--seconds`` inside
``measured_region()`` under the runner's meter (NVML counter at the edges, 10 Hz trace).

    python3 benchmarks/energy_probe.py --seconds 3 [--size 8192]

Prints the figures as JSON: the window, GPU joules and where they came from, mean and peak
power, the trace/counter ratio (the issue's check: within 5 % on windows of 2 s or more), TFLOP/s
and TFLOP per joule, and the GPU state at start and end. Without CUDA it multiplies on the CPU
(small) and says what could not be measured.
"""

from __future__ import annotations

import argparse
import json
import time

from hopperlab.core.window import listening
from hopperlab.cuda.nvtx import measured_region
from hopperlab.node.energy.meter import open_meter


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--size", type=int, default=8192)
    args = ap.parse_args()
    import torch

    cuda = torch.cuda.is_available()
    n = args.size if cuda else 256
    dev = "cuda" if cuda else "cpu"
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b  # warm-up
    meter = open_meter(per_rank=False, measure_host=True)
    iters = 0
    with listening(meter.listener):
        meter.start()
        time.sleep(0.5)  # idle before the window: the trace shows the step
        with measured_region():
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < args.seconds:
                for _ in range(20):
                    a @ b
                iters += 20
                if cuda:
                    torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0
        time.sleep(0.5)
    res = meter.finish()
    tflop = 2 * n**3 * iters / 1e12
    out = {"device": torch.cuda.get_device_name() if cuda else "cpu", "n": n, "iters": iters,
           "seconds": elapsed, "tflops": tflop / elapsed, **res.metrics, **res.tags,
           "gpu_state": res.gpu_state}
    if "energy_gpu_j" in res.metrics:
        out["tflop_per_j"] = tflop / res.metrics["energy_gpu_j"]
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
