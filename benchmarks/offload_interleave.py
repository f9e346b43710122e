"""Does an interleaved micro-batch schedule bring activation offload nearer target 1's step floor?

Offloading every saved activation of a step moves the bytes out during forward and back during
backward: one direction of the host link at a time, so a step is at least twice the link time
of its bytes (docs/benchmarks/finetune.md, fourth series). Split the batch into micro-batches
and run the forward of micro-batch k+1 before the backward of micro-batch k (F0 F1 B0 F2 B1 ...
B3, gradients accumulated), with two ``ActivationOffload`` instances taking turns so that each
holds one graph at a time: the copies of k+1 still leaving while k's come back use both
directions of the link at once. The cost: the copies of k+1 that lag into k's backward stay on
the device (``max_inflight_bytes``), and the micro-batch is 1, not the experiment's 4.

    PYTHONPATH=src python3 benchmarks/offload_interleave.py --out DIR

Random-weight Llama-2-7B, LoRA r=32 on q/k/v/o, the element-wise parts recomputed (the matrix's
target-1 model), bf16 autocast, AdamW, 4 x 2048 tokens an optimizer step. Prints a table and
writes DIR/offload_interleave.jsonl.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_gpu import LLAMA2_7B, llama, pinned_bandwidth  # noqa: E402

from hopperlab.memory import recompute_elementwise  # noqa: E402
from hopperlab.memory.layers import decoder_layers  # noqa: E402
from hopperlab.memory.activation_offload import (  # noqa: E402
    ActivationOffload, save_on_cpu_reference)

GiB = 1 << 30
MiB = 1 << 20


def step_whole(model: Any, ids: torch.Tensor, ctx: Callable[[], Any]) -> None:
    """One forward and one backward of the whole batch (the experiment's schedule)."""
    with torch.autocast("cuda", dtype=torch.bfloat16), ctx():
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()


def step_micro(model: Any, ids: torch.Tensor, ctxs: list[Callable[[], Any]],
               interleave: bool) -> None:
    """Micro-batches of one sequence, gradients accumulated. ``interleave``: F0 F1 B0 F2 B1 ...
    (context i % len(ctxs) for micro-batch i); else F0 B0 F1 B1 ..."""
    n = ids.shape[0]
    losses: list[Any] = [None] * n

    def forward(i: int) -> None:
        mb = ids[i:i + 1]
        with torch.autocast("cuda", dtype=torch.bfloat16), ctxs[i % len(ctxs)]():
            losses[i] = model(input_ids=mb, labels=mb, use_cache=False).loss / n

    if interleave:
        forward(0)
        for i in range(n):
            if i + 1 < n:
                forward(i + 1)
            losses[i].backward()
            losses[i] = None
    else:
        for i in range(n):
            forward(i)
            losses[i].backward()
            losses[i] = None


def measure(model: Any, run_step: Callable[[], Any], offloads: list["Counting"], warmup: int,
            steps: int) -> dict:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    times = []
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            for o in offloads:
                o.bytes = 0
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run_step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    del opt
    step = statistics.median(times)
    return {"step_s": step, "tokens_per_s": 4 * 2048 / step,
            "peak_alloc_gib": torch.cuda.max_memory_allocated() / GiB,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / GiB,
            "offloaded_gb": sum(o.bytes for o in offloads) / steps / 1e9}


class Counting:
    """An ActivationOffload as a context factory that sums the bytes offloaded by every forward
    it serves (complete when its forward ends)."""

    def __init__(self, model: Any, **kw: Any):
        self.off = ActivationOffload("cuda", **kw).wrap_layers(decoder_layers(model)) \
            .track_parameters(model)
        self.bytes = 0

    @contextlib.contextmanager
    def __call__(self) -> Any:
        with self.off:
            yield self.off
        self.bytes += self.off.stats().bytes_offloaded

    def close(self) -> None:
        self.off.remove()
        self.off.pool.clear()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--inflight-mib", default="256,2048,8192")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bw = pinned_bandwidth()
    print(f"pinned bandwidth: {bw}", flush=True)
    model = llama(LLAMA2_7B, torch.bfloat16, "cuda", lora_r=32)
    recompute_elementwise.apply(model)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (4, 2048), device="cuda", generator=gen)
    rows = []

    def run(name: str, make: Callable[[], tuple[Callable[[], Any], list[Counting]]]) -> None:
        gc.collect()
        torch.cuda.empty_cache()
        step, offloads = make()
        try:
            row = {"variant": name, **measure(model, step, offloads, args.warmup, args.steps)}
        except torch.OutOfMemoryError as exc:
            row = {"variant": name, "status": "oom", "error": str(exc)[:200]}
        finally:
            for o in offloads:
                o.close()
        rows.append(row)
        print(json.dumps(row), flush=True)

    run("batch4-baseline", lambda: (lambda: step_whole(model, ids, contextlib.nullcontext), []))
    run("mb1-baseline", lambda: (lambda: step_micro(model, ids, [contextlib.nullcontext],
                                                   False), []))
    run("batch4-save-on-cpu", lambda: (lambda: step_whole(model, ids, save_on_cpu_reference), []))

    def whole_offload() -> tuple[Callable[[], Any], list[Counting]]:
        a = Counting(model, keep_head=True, max_inflight_bytes=256 * MiB)
        return (lambda: step_whole(model, ids, a)), [a]
    run("batch4-offload", whole_offload)

    def micro_offload(interleave: bool, inflight: int) -> Any:
        def make() -> tuple[Callable[[], Any], list[Counting]]:
            pair = [Counting(model, keep_head=True, max_inflight_bytes=inflight * MiB)
                    for _ in range(2 if interleave else 1)]
            return (lambda: step_micro(model, ids, pair, interleave)), pair
        return make
    run("mb1-sequential-offload", micro_offload(False, 256))
    for mib in (int(v) for v in args.inflight_mib.split(",")):
        run(f"mb1-interleaved-offload-inflight-{mib}", micro_offload(True, mib))

    base = next((r for r in rows if r["variant"] == "batch4-baseline" and "step_s" in r), None)
    with open(args.out / "offload_interleave.jsonl", "a") as fh:
        fh.write(json.dumps({"variant": "pinned-1GiB", **bw}) + "\n")
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    print(f"\n{'variant':40} {'tok/s':>7} {'step s':>7} {'peak GiB':>8} {'GB out':>7} "
          f"{'floor x':>7} {'2-phase x':>9}")
    for r in rows:
        if "step_s" not in r:
            print(f"{r['variant']:40} {r.get('status')}")
            continue
        gb = r.get("offloaded_gb", 0.0)
        floor = max(base["step_s"] if base else 0.0, gb / bw["d2h_gbps"])
        two = gb / bw["d2h_gbps"] + gb / bw["h2d_gbps"]
        print(f"{r['variant']:40} {r['tokens_per_s']:7.0f} {r['step_s']:7.3f} "
              f"{r['peak_alloc_gib']:8.2f} {gb:7.2f} {r['step_s'] / floor:7.2f} "
              f"{(r['step_s'] / two if two else 0):9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
