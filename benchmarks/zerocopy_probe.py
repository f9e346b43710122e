"""How fast can GPU kernels read mapped pinned host memory (zero-copy), against the copy engine?

The database family's ``zero-copy`` placement lets its kernels read the columns straight from
page-locked host memory. Whether that can reach the link's speed depends on how the SMs' loads
become PCIe read requests: this probe measures a plain read-and-reduce kernel over one mapped
buffer for each column width the engine stores (uint8, int16, int32, int64), several tile sizes,
warps per program and launch shapes (one tile per program, or a persistent grid of a few
programs per SM looping over tiles), plus PyTorch's own reduction, and prints each as GB/s and
as a fraction of the copy engine's pinned host->device rate measured first on the same buffer.

    python benchmarks/zerocopy_probe.py [--gib 2] [--out results.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys

import numpy as np
import torch
import triton
import triton.language as tl

sys.path.insert(0, "src")
from hopperlab.cuda.link import pinned_copy_gbps  # noqa: E402
from hopperlab.workloads.database.placement import cuda_alias  # noqa: E402


@triton.jit
def _read_tiles(src, n, out, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src + offs, mask=offs < n, other=0)
    tl.store(out + pid, tl.sum(x.to(tl.int64), axis=0))


@triton.jit
def _read_persistent(src, n, out, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    tiles = tl.cdiv(n, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.int64)
    for t in tl.range(pid, tiles, progs, num_stages=STAGES):
        offs = t.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(src + offs, mask=offs < n, other=0).to(tl.int64)
    tl.store(out + pid, tl.sum(acc, axis=0))


def timed(fn, repeats: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--out")
    args = ap.parse_args()
    nbytes = int(args.gib * (1 << 30))
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    host.view(torch.int64)[:] = 1
    ce = pinned_copy_gbps("cuda", "h2d", nbytes, host=host)  # the copy engine, same buffer
    print(f"{torch.cuda.get_device_name(0)}; copy engine pinned h2d {ce:.1f} GB/s over "
          f"{nbytes / 1e9:.2f} GB", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = [{"kind": "copy-engine", "gbps": ce, "frac": 1.0}]

    def report(kind: str, dtype: str, cfg: str, seconds: float) -> None:
        gbps = nbytes / seconds / 1e9
        rows.append({"kind": kind, "dtype": dtype, "cfg": cfg, "gbps": gbps, "frac": gbps / ce})
        print(f"{kind:11s} {dtype:6s} {cfg:34s} {gbps:7.1f} GB/s  {gbps / ce:6.3f} of copy engine",
              flush=True)

    for np_dtype in (np.uint8, np.int16, np.int32, np.int64):
        n = nbytes // np.dtype(np_dtype).itemsize
        alias = cuda_alias(host.data_ptr(), n, np.dtype(np_dtype), torch.device("cuda"))
        name = np.dtype(np_dtype).name
        report("torch.sum", name, "", timed(lambda: alias.sum()))
        for block, warps in itertools.product((1024, 4096, 16384), (4, 8, 16)):
            grid = triton.cdiv(n, block)
            out = torch.empty(grid, dtype=torch.int64, device="cuda")
            report("tiles", name, f"BLOCK={block} warps={warps}",
                   timed(lambda: _read_tiles[(grid,)](alias, n, out, BLOCK=block, num_warps=warps)))
        for block, warps, per_sm, stages in itertools.product((2048, 8192), (8,), (4, 16), (1, 3)):
            grid = sms * per_sm
            out = torch.empty(grid, dtype=torch.int64, device="cuda")
            report("persistent", name, f"BLOCK={block} warps={warps} {per_sm}/SM stages={stages}",
                   timed(lambda: _read_persistent[(grid,)](alias, n, out, BLOCK=block,
                                                           STAGES=stages, num_warps=warps)))
    best = {}
    for r in rows[1:]:
        if r["frac"] > best.get(r["dtype"], {}).get("frac", 0):
            best[r["dtype"]] = r
    print("best per width: " + "; ".join(f"{d} {r['kind']} {r['cfg']} {r['frac']:.3f}"
                                         for d, r in best.items()))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
