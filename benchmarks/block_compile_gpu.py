"""One decoder layer of the sharded family's 13B model, forward and backward with activation
checkpointing at the rows' tokens per rank, eager against compiled (issue 35: the model ran at
1.40-1.53x of FLOPs / the measured bf16 matmul rate even alone on one GPU).

Printed: milliseconds per layer-step (median of CUDA-event-timed iterations after warm-up), the
same layer's matrix products alone (plain ``torch.mm`` of the same shapes, the four a linear
does under checkpointing: forward, its recomputation, the input and the weight gradients), the
FLOP floor at the bf16 8192^3 matmul rate measured here, and each as x of that floor; the
compile's own seconds. It also fills the inductor cache the workflow's 2-GPU rows then read
(same layer, same shapes). On the lent GPU machine, from the repository root:

    python3 benchmarks/block_compile_gpu.py [--tokens 32768] [--json OUT.json]

A CPU (tests): ``--device cpu --shape tiny --backend aot_eager``. Without CUDA and without
``--device cpu`` it exits 2: a GPU benchmark that ran on nothing must not look like one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

from hopperlab.cuda import device_rates
from hopperlab.workloads.finetune import SHAPES
from hopperlab.workloads.finetune.sharded import step_floor


def _timer(device: Any) -> Callable[[Callable[[], None], int], float]:
    """Median seconds of ``fn`` over ``n`` runs: CUDA events on a GPU (``device_rates``, one
    untimed run first), perf_counter on a CPU."""
    def cpu(fn: Callable[[], None], n: int) -> float:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return device_rates.median_event_s if device.type == "cuda" else cpu


def _layer_step(block: Any, x: Any, cos: Any, sin: Any, grad: Any) -> Callable[[], None]:
    def step() -> None:
        x.grad = None
        for p in block.parameters():
            p.grad = None
        block(x, cos, sin).backward(grad)
    return step


def _matmuls_step(shapes: list[tuple[int, int]], tokens: int, dtype: Any,
                  device: Any) -> Callable[[], None]:
    """The layer's linears as plain products: per weight [out, in], forward twice (the
    checkpoint's recomputation), the input gradient and the weight gradient."""
    import torch

    mats = [(torch.randn(tokens, i, dtype=dtype, device=device),
             torch.randn(o, i, dtype=dtype, device=device),
             torch.randn(tokens, o, dtype=dtype, device=device)) for o, i in shapes]

    def step() -> None:
        for x, w, dy in mats:
            torch.mm(x, w.t())
            torch.mm(x, w.t())
            torch.mm(dy, w)
            torch.mm(dy.t(), x)
    return step


def _agreement(eager: Any, compiled: Any, x: Any, cos: Any, sin: Any,
               grad: Any) -> dict[str, float]:
    """How far the compiled layer's output and input gradient are from eager's, as
    |a - b| / |b| (norms): a miscompile would show here, rounding differences stay small."""
    results = []
    for b in (eager, compiled):
        x.grad = None
        y = b(x, cos, sin)
        y.backward(grad)
        results.append((y.detach().float(), x.grad.detach().float()))
    (ye, ge), (yc, gc) = results
    return {"output_rel_diff": float((yc - ye).norm() / ye.norm()),
            "input_grad_rel_diff": float((gc - ge).norm() / ge.norm())}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from hopperlab.cuda.device_rates import matmul_tflops
    from hopperlab.workloads.finetune.sharded import llama, engine as sharded

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    hidden, heads, ffn, _vocab, _layers = SHAPES[args.shape]
    shape = llama.Shape(hidden, heads, ffn, _vocab, 1)
    seq = args.seq
    rows = max(1, args.tokens // seq)
    tokens = rows * seq
    time_it = _timer(device)
    rate = (matmul_tflops(device) if device.type == "cuda"
            else sharded.matmul_rate_tflops(device, dtype))

    def block() -> Any:
        b = llama.Block(shape, dtype, device, checkpointing=True)
        with torch.no_grad():
            for p in b.parameters():
                (p.fill_(1.0) if p.dim() == 1 else p.normal_(0.0, 0.02))
        return b

    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, seq, hidden, generator=g, device=device, dtype=dtype).requires_grad_()
    grad = torch.randn(rows, seq, hidden, generator=g, device=device, dtype=dtype)
    cos, sin = llama.rope_tables(seq, hidden // heads, device, dtype)
    matmul_params = 4 * hidden * hidden + 3 * hidden * ffn
    flops = step_floor.step_flops(matmul_params, 0, 1, hidden, seq, tokens, checkpointing=True)
    floor_s = flops / (rate * 1e12)
    out: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch."), "tokens": float(tokens), "seq": float(seq), "hidden": float(hidden),
                             "ffn": float(ffn), "matmul_tflops": rate, "layer_tflop": flops / 1e12,
                             "floor_ms": floor_s * 1e3}

    eager = block()
    step = _layer_step(eager, x, cos, sin, grad)
    for _ in range(args.warmup):
        step()
    out["eager_ms"] = time_it(step, args.iters) * 1e3
    del step

    mm = _matmuls_step([(3 * hidden, hidden), (hidden, hidden), (2 * ffn, hidden), (hidden, ffn)],
                       tokens, dtype, device)
    mm()
    out["matmuls_only_ms"] = time_it(mm, args.iters) * 1e3
    del mm

    compiled = block()
    compiled.load_state_dict(eager.state_dict())  # the same weights: outputs comparable
    compiled.forward = torch.compile(compiled.forward, backend=args.backend, fullgraph=True)
    step = _layer_step(compiled, x, cos, sin, grad)
    t0 = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    out["compile_s"] = time.perf_counter() - t0
    for _ in range(args.warmup):
        step()
    out["compiled_ms"] = time_it(step, args.iters) * 1e3
    out.update(_agreement(eager, compiled, x, cos, sin, grad))
    for key in ("eager", "matmuls_only", "compiled"):
        out[f"{key}_over_floor"] = out[f"{key}_ms"] / out["floor_ms"]
    out["compiled_speedup"] = out["eager_ms"] / out["compiled_ms"]
    if device.type == "cuda":
        out["peak_gpu_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="llama-2-13b", choices=sorted(SHAPES))
    ap.add_argument("--tokens", type=int, default=32768, help="tokens per step (rows x seq)")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("block_compile_gpu: no CUDA device (a GPU benchmark; --device cpu to test it)",
              file=sys.stderr)
        return 2
    out = run(args)
    print(f"one {args.shape} decoder layer, {int(out['tokens'])} tokens (seq {args.seq}), "
          f"forward + backward with checkpointing, {args.device}; {out['dtype']} matmul "
          f"{out['matmul_tflops']:.0f} TFLOP/s; floor {out['floor_ms']:.2f} ms "
          f"({out['layer_tflop']:.2f} TFLOP)")
    for key, label in (("eager", "eager"), ("compiled", f"compiled ({args.backend})"),
                       ("matmuls_only", "its matmuls alone")):
        print(f"  {label:<22} {out[f'{key}_ms']:9.2f} ms  {out[f'{key}_over_floor']:.2f}x floor")
    print(f"  compile {out['compile_s']:.1f} s; compiled / eager speed-up "
          f"{out['compiled_speedup']:.2f}x; compiled vs eager: output "
          f"{out['output_rel_diff']:.1e}, input gradient {out['input_grad_rel_diff']:.1e} "
          f"(relative norms)")
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
