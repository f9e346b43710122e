"""Our managed-memory allocator against RAPIDS RMM's, the public implementation of the same idea.

Both make ``cudaMallocManaged`` PyTorch's CUDA allocator through ``CUDAPluggableAllocator``.
Each variant runs in its own process, because the allocator goes in before CUDA starts. The
variants:

* ``device``: PyTorch's caching allocator, the reference;
* ``ours``: ``hopperlab.memory.managed_allocator`` with the finetune default advice
  (preferred location: the GPU);
* ``rmm-pool``: RMM's ``PoolMemoryResource`` over its ``ManagedMemoryResource``, the setup RMM
  recommends;
* ``rmm-plain``: ``ManagedMemoryResource`` alone, one ``cudaMallocManaged`` per allocation.

The safety rule holds for all of them: no more managed memory than the GPU has free, less a
margin (``managed_allocator.managed_cap_bytes``). The RMM pool's maximum is that cap, and the
plain resource sits under RMM's ``LimitingResourceAdaptor`` at the same cap.

    PYTHONPATH=src:<rmm wheels> python3 benchmarks/managed_peer.py --out DIR

The model is a random-weight Llama-2-7B with LoRA r=32 on q/k/v/o, bf16 autocast, AdamW, batch
4 x 2048, the loop of ``benchmarks/memory_gpu.py``. The script prints a table and writes
DIR/managed_peer.jsonl.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

GiB = 1 << 30
KINDS = ("device", "ours", "rmm-pool", "rmm-plain")
#: the RMM pool starts at this much (or the cap, if less), then grows up to the cap
RMM_INITIAL_POOL = 64 * GiB


def install(kind: str) -> Any:
    """Put ``kind``'s allocator in (before CUDA starts). Returns an object whose ``stats()`` has
    what ``memory_gpu.measure`` reads of a managed allocator, or None for ``device``."""
    if kind == "device":
        return None
    if kind == "ours":
        from hopperlab.memory.managed_allocator import install_managed_allocator

        return install_managed_allocator(0, advise="preferred_device")
    import rmm
    import torch
    from cuda.bindings import runtime as cudart
    from rmm.allocators.torch import rmm_torch_allocator

    from hopperlab.memory.managed_allocator import managed_cap_bytes

    err, free, total = cudart.cudaMemGetInfo()
    if int(err) != 0:
        raise RuntimeError(f"cudaMemGetInfo failed: {err}")
    cap = managed_cap_bytes(free, total, oversubscription=False)
    cap -= cap % 256
    upstream = rmm.mr.ManagedMemoryResource()
    if kind == "rmm-pool":
        held = rmm.mr.PoolMemoryResource(upstream, initial_pool_size=min(RMM_INITIAL_POOL, cap),
                                         maximum_pool_size=cap)
    else:
        held = rmm.mr.LimitingResourceAdaptor(upstream, allocation_limit=cap)
    counted = rmm.mr.StatisticsResourceAdaptor(held)
    rmm.mr.set_current_device_resource(counted)
    torch.cuda.memory.change_current_allocator(rmm_torch_allocator)

    class RmmStats:
        def stats(self) -> SimpleNamespace:
            c = counted.allocation_counts
            pool = held.pool_size() if kind == "rmm-pool" else c.peak_bytes
            return SimpleNamespace(peak_managed_bytes=pool, peak_in_use_bytes=c.peak_bytes,
                                   managed_calls=-1, cap_bytes=cap)
    return RmmStats()


def child(args: argparse.Namespace) -> None:
    managed = install(args.child)
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from memory_gpu import LLAMA2_7B, llama, measure

    out: dict[str, Any] = {"variant": args.child}
    try:
        model = llama(LLAMA2_7B, torch.bfloat16, "cuda", lora_r=32)
        out.update(measure(model, None, batch=4, seq=2048, warmup=args.warmup,
                           steps=args.steps, managed=managed))
    except torch.OutOfMemoryError as exc:
        out.update(status="oom", error=str(exc)[:300])
    print(json.dumps(out), flush=True)
    with open(args.out / "managed_peer.jsonl", "a") as fh:
        fh.write(json.dumps(out) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--child", choices=KINDS)
    ap.add_argument("--timeout-s", type=int, default=150)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        child(args)
        return 0
    for kind in args.kinds.split(","):
        cmd = [sys.executable, __file__, "--out", str(args.out), "--child", kind,
               "--steps", str(args.steps), "--warmup", str(args.warmup)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
            if proc.returncode:
                print(f"{kind}: exit {proc.returncode}\n{proc.stderr[-1500:]}", flush=True)
        except subprocess.TimeoutExpired:
            print(f"{kind}: over {args.timeout_s} s, stopped", flush=True)
    rows = [json.loads(line) for line in (args.out / "managed_peer.jsonl").read_text().splitlines()]
    base = next((r for r in rows if r["variant"] == "device" and "step_s" in r), None)
    print(f"\n{'variant':10} {'tok/s':>7} {'x device':>8} {'in use GiB':>10} {'held GiB':>8}")
    for r in rows:
        if "step_s" not in r:
            print(f"{r['variant']:10} {r.get('status')}: {r.get('error', '')[:120]}")
            continue
        ratio = r["tokens_per_s"] / base["tokens_per_s"] if base else float("nan")
        in_use = r.get("peak_in_use_gib", r.get("peak_alloc_gib", 0.0))
        held = r.get("peak_managed_gib", r.get("peak_reserved_gib", 0.0))
        print(f"{r['variant']:10} {r['tokens_per_s']:7.0f} {ratio:8.3f} {in_use:10.1f} "
              f"{held:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
