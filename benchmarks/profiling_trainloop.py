"""A tiny fine-tuning-like training loop, marked the hopperlab way, for profiling tests.

Not a family: a stand-in for the fine-tuning family's loop until that family exists, so that
the profiling pipeline (nsys or the torch profiler -> ``prof_`` metrics) can be shown on the
source talk's comparisons on a real GPU: ``--num-workers 0`` vs ``4`` (a data set whose items
cost CPU time, as tokenisation does) and ``--memory managed`` (each batch staged in CUDA managed
memory written by the CPU, so the GPU's reads migrate pages: unified-memory traffic). It writes
a run directory like a hopperlab job (``record.json`` through a ``Recorder``), so
``hopperlab profile job`` can wrap it exactly as it wraps a job::

    python benchmarks/profiling_trainloop.py RUN_DIR --num-workers 4 --profiler nsys

NVTX ranges (``hopperlab.cuda.nvtx``): ``data.wait``, ``step``, ``forward``, ``backward``,
``optimizer``; the measured steps are in ``profiled_region`` (after ``--warmup`` steps).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from hopperlab.cuda import nvtx
from hopperlab.core.rundir import Recorder


class CpuHeavyItems(Dataset):
    """Items that take ``work`` rounds of CPU arithmetic each, like tokenising a sample."""

    def __init__(self, n: int, features: int, work: int) -> None:
        self.n, self.features, self.work = n, features, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        x = torch.randn(self.features, generator=g)
        for _ in range(self.work):
            x = torch.tanh(x * 1.01 + 0.01)
        return x, x.sum().reshape(1)


def model_for(features: int, hidden: int, layers: int) -> torch.nn.Module:
    mods: list[torch.nn.Module] = [torch.nn.Linear(features, hidden), torch.nn.GELU()]
    for _ in range(layers - 1):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.GELU()]
    mods.append(torch.nn.Linear(hidden, 1))
    return torch.nn.Sequential(*mods)


class ManagedStaging:
    """One managed-memory buffer per batch tensor: the CPU writes the batch into it, the GPU
    reads it where it is (pages migrate on each step's first touch)."""

    def __init__(self, shapes: list[tuple[int, ...]], device: int) -> None:
        from hopperlab.cuda.managed_policy import managed_bytes_allowed
        from hopperlab.cuda.runtime import CudaArray, CudaRuntime, host_view

        self.rt = CudaRuntime()
        sizes = [4 * int(torch.tensor(s).prod()) for s in shapes]
        free, _ = torch.cuda.mem_get_info(device)
        if not managed_bytes_allowed(sum(sizes), free, False, False):
            raise SystemExit(f"managed staging of {sum(sizes)} bytes refused: {free} bytes free")
        self.ptrs = [self.rt.malloc_managed(n) for n in sizes]
        self.host = [host_view(p, n).view("float32").reshape(s)
                     for p, n, s in zip(self.ptrs, sizes, shapes)]
        self.gpu = [torch.as_tensor(CudaArray(p, n), device=f"cuda:{device}")
                    .view(torch.float32).view(s) for p, n, s in zip(self.ptrs, sizes, shapes)]

    def put(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        torch.cuda.synchronize()  # the previous step is done with the buffers
        for host, t in zip(self.host, tensors):
            host[...] = t.numpy()
        return self.gpu

    def close(self) -> None:
        torch.cuda.synchronize()
        for p in self.ptrs:
            self.rt.free(p)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--memory", choices=("device", "managed"), default="device")
    ap.add_argument("--profiler", choices=("none", "nsys", "torch"), default="none")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--item-work", type=int, default=10, help="CPU rounds per item")
    args = ap.parse_args(argv)

    key = f"trainloop/w{args.num_workers}-{args.memory}/{args.profiler}"
    rec = Recorder(args.run_dir, identity={"key": key, "family": "trainloop",
                                           "experiment": f"w{args.num_workers}-{args.memory}",
                                           "variant": args.profiler})
    cuda = torch.cuda.is_available()
    if args.memory == "managed" and not cuda:
        rec.finish("skipped", "memory=managed needs a CUDA device")
        return 0
    dev = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    model = model_for(args.features, args.hidden, args.layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    items = CpuHeavyItems(args.batch * (args.steps + args.warmup), args.features, args.item_work)
    loader = DataLoader(items, batch_size=args.batch, num_workers=args.num_workers,
                        persistent_workers=args.num_workers > 0,
                        prefetch_factor=4 if args.num_workers else None, pin_memory=cuda)
    staging = ManagedStaging([(args.batch, args.features), (args.batch, 1)], dev.index or 0) \
        if args.memory == "managed" else None
    for name, value in vars(args).items():
        if name != "run_dir":
            rec.set_tag(f"trainloop.{name}", value)
    batches = iter(loader)

    def step(i: int) -> float:
        with nvtx.nvtx_range(nvtx.DATA_WAIT):
            x, y = next(batches)
        with nvtx.nvtx_range(nvtx.STEP):
            if staging is not None:
                x, y = staging.put([x, y])
            else:
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            with nvtx.nvtx_range(nvtx.FORWARD):
                loss = torch.nn.functional.mse_loss(model(x), y)
            with nvtx.nvtx_range(nvtx.BACKWARD):
                loss.backward()
            with nvtx.nvtx_range(nvtx.OPTIMIZER):
                opt.step()
                opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    try:
        for i in range(args.warmup):
            step(i)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with nvtx.profiled_region(args.profiler, rec):
            for i in range(args.steps):
                t = time.perf_counter()
                loss = step(args.warmup + i)
                rec.log_step(i, loss=loss, step_s=time.perf_counter() - t)
        seconds = time.perf_counter() - t0
        rec.log_metrics(step_s=seconds / args.steps,
                        samples_per_s=args.steps * args.batch / seconds)
    finally:
        if staging is not None:
            staging.close()
    rec.finish("ok")
    print(f"{key}: {seconds / args.steps * 1e3:.2f} ms/step", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
