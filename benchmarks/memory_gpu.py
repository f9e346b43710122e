"""GPU checks of hopperlab.memory: correctness in bf16 and a first performance comparison.

  PYTHONPATH=src python3 benchmarks/memory_gpu.py --out DIR [--parts correct,perf,fp8,managed]

* ``correct``: a tiny LoRA Llama (bf16, 4 layers) on the GPU: loss and every adapter gradient with
  activation offload, checkpointing, both, parameter offload, parameter+activation offload (and
  with checkpointing) against the plain step. Prints the largest relative difference.
* ``perf``: random-weight Llama-2-7B, LoRA r=32 on q/k/v/o, AdamW, bf16 autocast, batch 4 x 2048:
  baseline, ``save_on_cpu`` (PyTorch), our activation offload of everything, budgeted at 40 GiB,
  checkpointing, checkpointing + offload. Tokens/s (median of the measured steps), peak
  allocated/reserved GiB, bytes offloaded per step, pinned bandwidth measured here and the floor
  of the issue (max of the baseline step and offloaded bytes / pinned device->host bandwidth).
* ``managed``: the baseline step with every allocation through cudaMallocManaged (run in a fresh
  process: the allocator must be installed before CUDA starts).
* ``fp8``: torchao FP8 + per-layer compile on a tiny Llama (functional: loss close to bf16).

Writes ``memory_gpu.json`` under ``--out`` and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from hopperlab.memory.layers import decoder_layers
from hopperlab.memory.activation_offload import ActivationOffload, save_on_cpu_reference
from hopperlab.memory.checkpointing import checkpoint_layers
from hopperlab.memory.parameter_offload import ParameterOffload

GiB = 1 << 30


def llama(cfg_kw: dict, dtype: torch.dtype, device: str, lora_r: int | None, seed: int = 0):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(attn_implementation="sdpa", **cfg_kw)
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    if lora_r is None:
        return model
    model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.0,
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen, device=device, dtype=p.dtype) * 0.01)
    return model


# ----------------------------------------------------------------------------- correctness
def part_correct(results: dict) -> None:
    import copy

    dev = "cuda"
    cfg = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512)
    base_model = llama(cfg, torch.bfloat16, dev, lora_r=8)
    gen = torch.Generator(device=dev).manual_seed(3)
    ids = torch.randint(0, 1024, (2, 256), device=dev, generator=gen)

    def run(model, ctx=None):
        model.zero_grad(set_to_none=True)
        with (ctx() if ctx else contextlib.nullcontext()):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        return loss.detach().float(), {n: p.grad.float().clone() for n, p in model.named_parameters()
                                       if p.requires_grad}

    ref = run(base_model)

    def compare(name, got):
        loss_d = abs(got[0] - ref[0]).item() / max(abs(ref[0]).item(), 1e-12)
        worst = 0.0
        exact = torch.equal(got[0], ref[0])
        for k, g in ref[1].items():
            d = (got[1][k] - g).abs().max().item() / max(g.abs().max().item(), 1e-12)
            worst = max(worst, d)
            exact = exact and torch.equal(got[1][k], g)
        ok = loss_d < 1e-2 and worst < 2e-2
        results["correct"][name] = {"loss_rel": loss_d, "grad_rel_max": worst, "bitwise": exact, "ok": ok}
        print(f"correct {name:28s} loss_rel={loss_d:.2e} grad_rel_max={worst:.2e} bitwise={exact} ok={ok}",
              flush=True)

    results["correct"] = {}
    m = copy.deepcopy(base_model)
    off = ActivationOffload(dev, min_bytes=1 << 12).wrap_layers(decoder_layers(m)).track_parameters(m)
    compare("activation_offload", run(m, lambda: off))
    compare("activation_offload_step2", run(m, lambda: off))
    results["correct"]["activation_offload_step2"]["pool_new_allocations"] = off.stats().pool_new_allocations
    m = copy.deepcopy(base_model)
    checkpoint_layers(decoder_layers(m))
    compare("checkpointing", run(m))
    off = ActivationOffload(dev, min_bytes=1 << 12).wrap_layers(decoder_layers(m)).track_parameters(m)
    compare("checkpointing+offload", run(m, lambda: off))
    m = copy.deepcopy(base_model)
    po = ParameterOffload(decoder_layers(m), dev, resident_layers=1, prefetch=1)
    compare("parameter_offload", run(m, lambda: po))
    compare("parameter_offload_step2", run(m, lambda: po))
    off = ActivationOffload(dev, min_bytes=1 << 12, parameter_offload=po).wrap_layers(decoder_layers(m))
    compare("parameter+activation", run(m, lambda: off))
    checkpoint_layers(decoder_layers(m))
    compare("parameter+activation+ckpt", run(m, lambda: off))
    m = po = off = base_model = None   # dropped (not del: the lambdas above name them)
    gc.collect()
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- performance
LLAMA2_7B = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096)


def pinned_bandwidth(nbytes: int = GiB) -> dict:
    """Pinned copy GB/s each way, through a buffer of the offload's own pool (registered with
    cudaHostRegister at its exact size), median of 5."""
    from hopperlab.memory.pinned import PinnedBufferPool
    from hopperlab.cuda.link import pinned_copy_gbps

    pool = PinnedBufferPool(pin=True)
    host = pool.acquire(nbytes)
    out = {f"{d}_gbps": pinned_copy_gbps("cuda", d, nbytes, host=host) for d in ("d2h", "h2d")}
    pool.release(host)
    pool.clear()
    torch.cuda.empty_cache()
    return out


def measure(model, make_ctx, *, batch: int, seq: int, warmup: int, steps: int, managed=None) -> dict:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), device="cuda", generator=gen)
    times, losses = [], []
    offload_stats = None
    for i in range(warmup + steps):
        if i == warmup and managed is None:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ctx = make_ctx() if make_ctx else contextlib.nullcontext()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            with ctx:
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
            if isinstance(ctx, ActivationOffload):
                offload_stats = ctx.stats().as_dict()
    step = statistics.median(times)
    out = {"step_s": step, "tokens_per_s": batch * seq / step, "loss_last": losses[-1],
           "steps": steps, "warmup": warmup}
    if managed is None:
        out["peak_alloc_gib"] = torch.cuda.max_memory_allocated() / GiB
        out["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GiB
    else:
        st = managed.stats()
        out["peak_managed_gib"] = st.peak_managed_bytes / GiB
        out["peak_in_use_gib"] = st.peak_in_use_bytes / GiB
        out["managed_calls"] = st.managed_calls
        out["cap_gib"] = (st.cap_bytes or 0) / GiB
    if offload_stats:
        out["offload"] = offload_stats
    del opt
    return out


def part_perf(results: dict, args) -> None:
    results["bandwidth"] = pinned_bandwidth()
    print(f"pinned bandwidth: {results['bandwidth']}", flush=True)
    model = llama(LLAMA2_7B, torch.bfloat16, "cuda", lora_r=32)
    layers = decoder_layers(model)
    kw = dict(batch=args.batch, seq=args.seq, warmup=args.warmup, steps=args.steps)
    perf = results["perf"] = {}

    def variant(name, make_ctx, setup=None, teardown=None):
        gc.collect()
        torch.cuda.empty_cache()
        state = setup() if setup else None
        try:
            perf[name] = measure(model, make_ctx(state) if make_ctx else None, **kw)
        except torch.OutOfMemoryError as exc:
            perf[name] = {"status": "oom", "error": str(exc)[:300]}
        if teardown:
            teardown(state)
        print(f"perf {name}: {json.dumps(perf[name])}", flush=True)

    wanted = args.variants.split(",")

    def offload_variant(name, **kw):
        if name in wanted:
            variant(name, lambda off: (lambda: off),
                    setup=lambda: ActivationOffload("cuda", **kw).wrap_layers(layers).track_parameters(model),
                    teardown=lambda off: (off.remove(), off.pool.clear()))

    if "baseline" in wanted:
        variant("baseline", None)
    offload_variant("activation_offload")
    offload_variant("activation_offload_prefetch2", prefetch_groups=2)
    offload_variant("activation_offload_inflight4g", max_inflight_bytes=4 * GiB)
    offload_variant("activation_offload_budget40", budget_bytes=40 * GiB)
    if "checkpointing" in wanted:
        variant("checkpointing", None, setup=lambda: checkpoint_layers(layers), teardown=lambda h: h.remove())

    def ck_off():
        return checkpoint_layers(layers), ActivationOffload("cuda").wrap_layers(layers).track_parameters(model)
    if "checkpointing+offload" in wanted:
        variant("checkpointing+offload", lambda st: (lambda: st[1]), setup=ck_off,
                teardown=lambda st: (st[0].remove(), st[1].remove(), st[1].pool.clear()))
    if "save_on_cpu" in wanted:
        variant("save_on_cpu", lambda _s: save_on_cpu_reference)
    with contextlib.suppress(Exception):
        torch._C._host_emptyCache()
    model = None   # dropped (not del: the closures above name it)
    gc.collect()
    torch.cuda.empty_cache()


def part_managed(results: dict, args) -> None:
    """Runs in a child process (the allocator goes in before CUDA starts)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, __file__, "--managed-child", "--out", str(args.out), "--batch", str(args.batch),
           "--seq", str(args.seq), "--warmup", str(args.warmup), "--steps", str(args.steps)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.managed_timeout)
    print(proc.stdout[-3000:], proc.stderr[-3000:], flush=True)
    child = Path(args.out) / "managed_child.json"
    results["managed"] = json.loads(child.read_text()) if child.exists() else {"status": "failed",
                                                                               "rc": proc.returncode}


def managed_child(args) -> None:
    from hopperlab.memory.managed_allocator import install_managed_allocator

    out: dict = {}
    t0 = time.perf_counter()
    alloc = install_managed_allocator(0, advise=args.advise, prefetch=args.prefetch)
    out["install_s"] = time.perf_counter() - t0
    out["cap_gib"] = (alloc.cap_bytes or 0) / GiB
    out["free_gib_at_install"] = alloc.free_bytes_at_install / GiB
    try:
        model = llama(LLAMA2_7B, torch.bfloat16, "cuda", lora_r=32)
        out.update(measure(model, None, batch=args.batch, seq=args.seq, warmup=args.warmup,
                           steps=args.steps, managed=alloc))
    except torch.OutOfMemoryError as exc:
        out.update(status="oom", error=str(exc)[:500], **alloc.stats().as_dict())
    print("managed", json.dumps(out), flush=True)
    (Path(args.out) / "managed_child.json").write_text(json.dumps(out, indent=1))


def part_fp8(results: dict) -> None:
    from hopperlab.memory.fp8 import compile_layers, convert_to_fp8, fp8_unavailable_reason

    reason = fp8_unavailable_reason()
    if reason:
        results["fp8"] = {"status": "skipped", "reason": reason}
        return
    cfg = dict(vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
               num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=512)
    out = {}
    for name, fp8 in (("bf16+compile", False), ("fp8+compile", True)):
        model = llama(cfg, torch.bfloat16, "cuda", lora_r=None)
        if fp8:
            out["converted"] = len(convert_to_fp8(model, lora=False))
        t0 = time.perf_counter()
        compile_layers(model)
        r = measure(model, None, batch=4, seq=512, warmup=2, steps=3)
        r["first_steps_s"] = time.perf_counter() - t0
        out[name] = r
    # LoRA: bf16 vs FP8 base projections (ours: FrozenFloat8Linear; torchao's own function):
    # loss and adapter gradients of one step on the same batch
    ids = torch.randint(0, 1024, (4, 512), device="cuda", generator=torch.Generator("cuda").manual_seed(1))

    def lora_step(kind):
        m = llama(cfg, torch.bfloat16, "cuda", lora_r=8)
        if kind != "bf16":
            out[f"lora_{kind}_converted"] = len(convert_to_fp8(m, lora=True, frozen_kernel=(kind == "fp8_frozen")))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        grads = {n: p.grad.float() for n, p in m.named_parameters() if p.requires_grad}
        return loss.item(), grads

    ref_loss, ref_grads = lora_step("bf16")
    for kind in ("fp8_frozen", "fp8_torchao"):
        loss, grads = lora_step(kind)
        rel = max(((grads[k] - g).norm() / g.norm().clamp_min(1e-12)).item() for k, g in ref_grads.items())
        out[f"lora_{kind}"] = {"loss": loss, "bf16_loss": ref_loss, "grad_rel_l2_max": rel}
    results["fp8"] = out
    print("fp8", json.dumps(out)[:2000], flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--parts", default="correct,perf,managed,fp8")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--variants", default="baseline,activation_offload,activation_offload_budget40,"
                    "checkpointing,checkpointing+offload,save_on_cpu")
    ap.add_argument("--advise", default="none")
    ap.add_argument("--prefetch", action="store_true")
    ap.add_argument("--managed-timeout", type=int, default=120)
    ap.add_argument("--managed-child", action="store_true")
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.managed_child:
        managed_child(args)
        return
    results: dict = {"torch": torch.__version__, "cuda": torch.version.cuda,
                     "gpu": torch.cuda.get_device_name(0), "argv": sys.argv}
    with contextlib.suppress(Exception):
        results["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True).stdout.strip()
    print(results, flush=True)
    path = Path(args.out) / "memory_gpu.json"
    parts = args.parts.split(",")
    for part in parts:
        t0 = time.perf_counter()
        try:
            if part == "correct":
                part_correct(results)
            elif part == "perf":
                part_perf(results, args)
            elif part == "managed":
                part_managed(results, args)
            elif part == "fp8":
                part_fp8(results)
        except Exception as exc:  # noqa: BLE001 - keep the other parts' figures
            import traceback
            traceback.print_exc()
            results[f"{part}_error"] = f"{type(exc).__name__}: {exc}"[:1000]
        results[f"{part}_s"] = time.perf_counter() - t0
        path.write_text(json.dumps(results, indent=1, default=str))
    print_table(results)


def print_table(results: dict) -> None:
    perf = results.get("perf", {})
    bw = results.get("bandwidth", {}).get("d2h_gbps")
    base = perf.get("baseline", {})
    print(f"\n{'variant':30s} {'tok/s':>8s} {'step s':>7s} {'peak GiB':>9s} {'resv GiB':>9s} {'offl GB':>8s} {'floor s':>8s}")
    for name, r in list(perf.items()) + ([("managed", results["managed"])] if "managed" in results else []):
        if "tokens_per_s" not in r:
            print(f"{name:30s} {r.get('status', '?')}")
            continue
        offl = r.get("offload", {}).get("bytes_offloaded", 0) / 1e9
        floor = max(base.get("step_s", 0), offl / bw) if (bw and offl) else float("nan")
        peak = r.get("peak_alloc_gib", r.get("peak_managed_gib", float("nan")))
        resv = r.get("peak_reserved_gib", r.get("peak_in_use_gib", float("nan")))
        print(f"{name:30s} {r['tokens_per_s']:8.0f} {r['step_s']:7.3f} {peak:9.1f} {resv:9.1f} {offl:8.1f} {floor:8.3f}")


if __name__ == "__main__":
    main()
