"""Does a tiny device->host read wait behind the offload's big device->host copies?

    python3 benchmarks/sync_behind_copies.py [--copies 8] [--mib 1024]

Queues ``--copies`` copies of ``--mib`` MiB from device memory to pinned host memory on a side
stream (as activation offload does), then, at once, reads a 2-element tensor of the compute
stream on the host: with ``tolist()`` (a 16-byte device->host cudaMemcpyAsync), with
``HostReadback`` (a kernel stores into mapped pinned memory), and through ``torch.bincount``
(which reads its input's largest value back to size its output). Prints how long the host waited for
each, against the same read on an idle link and against the time the queued copies take. If
``tolist()`` waits about as long as the copies, the small copy queues behind them, and an MoE
layer's routing read stalls the forward of a step that offloads (docs/benchmarks/moe.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

sys.path.insert(0, "src")
from hopperlab.cuda.host_readback import HostReadback  # noqa: E402
from hopperlab.memory.pinned import pinned_empty  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    nbytes = args.mib << 20
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = pinned_empty(nbytes)
    side = torch.cuda.Stream()
    small = torch.tensor([3, 5], device="cuda")
    readback = HostReadback(2)
    compute = torch.cuda.current_stream()

    def queue_copies() -> torch.cuda.Event:
        side.wait_stream(compute)
        with torch.cuda.stream(side):
            for _ in range(args.copies):
                dst.copy_(src, non_blocking=True)
        done = torch.cuda.Event(enable_timing=True)
        done.record(side)
        return done

    def timed(read, busy: bool) -> tuple[float, float]:
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        start.record(side)
        done = queue_copies() if busy else None
        t0 = time.perf_counter()
        value = read()
        waited = time.perf_counter() - t0
        assert value == [3, 5], value
        copies_s = 0.0
        if done is not None:
            done.synchronize()
            copies_s = start.elapsed_time(done) / 1e3
        return waited, copies_s

    reads = {"tolist": small.tolist, "HostReadback": lambda: readback.read(small),
             "bincount": lambda: (torch.bincount(small), [3, 5])[1]}
    for name, read in reads.items():
        timed(read, busy=True)  # warm-up (allocations, first launch)
        idle = statistics.median(timed(read, busy=False)[0] for _ in range(args.repeats))
        busy = [timed(read, busy=True) for _ in range(args.repeats)]
        waited = statistics.median(w for w, _ in busy)
        copies = statistics.median(c for _, c in busy)
        print(f"{name:13s} idle link {idle * 1e3:8.3f} ms   behind {args.copies} x {args.mib} MiB "
              f"of copies {waited * 1e3:8.3f} ms   (the copies took {copies * 1e3:.1f} ms, "
              f"{args.copies * nbytes / copies / 1e9:.1f} GB/s)")


if __name__ == "__main__":
    main()
