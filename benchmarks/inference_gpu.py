"""The inference family's targets on one GPU: random-weight Llama-2-7B, bf16.

  PYTHONPATH=src python3 benchmarks/inference_gpu.py --out OUT [--budget-s 330]

Sections (each a table, all figures also in OUT/inference_gpu.json; a section past --budget-s is
not started, a section that fails is reported and the rest go on):

1. link: pinned host->device GB/s, measured here (1 GiB copies, median of 5), so that every
   floor below comes from the same machine and run as the result it judges.
2. kv: for each context length (1k, 4k, 16k tokens) a session's cache is made by a prefill and
   evicted to pinned host memory (and to managed memory); then, for each new-turn length, the
   median of ``--repeats`` of: time to first token (TTFT) with the cache resident; after a
   plain reload (whole cache, then the turn's prefill: "serial"); after a layer-by-layer reload
   overlapped with the prefill ("layered"); after a managed-memory prefetch per layer; after a
   recompute (prefill of context + turn); and the reload alone. Targets: serial TTFT within 1.1x
   of cache bytes / pinned GB/s + resident TTFT; offload at least 3x faster than recompute at 4k;
   layered against max(reload, prefill). Greedy tokens after each reload are checked equal to
   the resident ones (bit-identical caches: they must be).
3. stream: tokens/s of decode over shares of layers resident x batch sizes with the double
   buffer, against the floor streamed bytes / pinned GB/s; then accelerate's dispatch_model at
   50% resident, batch 1 (the model is dispatched last: accelerate's hooks cannot be undone).
4. workload (optional, --workload): the kv-cache variants through ``workload.run`` (the job
   body) at a reduced full scale, one model build each.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

GB = 1e9
CONFIG = ROOT / "models" / "llama-2-7b" / "config.json"


class Bench:
    def __init__(self, out: Path, budget_s: float) -> None:
        self.out = out
        self.t0 = time.monotonic()
        self.budget_s = budget_s
        self.results: dict[str, Any] = {}

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def save(self) -> None:
        (self.out / "inference_gpu.json").write_text(json.dumps(self.results, indent=2,
                                                                default=str) + "\n")

    def section(self, name: str, fn: Callable[[], Any]) -> Any:
        if self.elapsed() > self.budget_s:
            print(f"[budget] {name}: not run ({self.elapsed():.0f}s > {self.budget_s:.0f}s)",
                  flush=True)
            self.results[name] = {"status": "not run (budget)"}
            self.save()
            return None
        t = time.monotonic()
        print(f"== {name} (t={self.elapsed():.0f}s)", flush=True)
        try:
            value = fn()
            self.results.setdefault(name, {})
            if isinstance(self.results[name], dict):
                self.results[name]["status"] = "ok"
                self.results[name]["seconds"] = round(time.monotonic() - t, 1)
        except Exception as exc:  # noqa: BLE001 - report and go on with the next section
            traceback.print_exc()
            self.results[name] = {**(self.results.get(name) or {}),
                                  "status": f"failed: {type(exc).__name__}: {exc}"[:800]}
            value = None
        self.save()
        return value


def median_of(n: int, fn: Callable[[], float]) -> float:
    return statistics.median(fn() for _ in range(n))


# --------------------------------------------------------------------------- kv
def kv_section(b: Bench, model: Any, rt: Any, gbps: float, contexts: list[int],
               turns: list[int], repeats: int) -> None:
    import torch

    from hopperlab.workloads.inference.generation import decode, prefill
    from hopperlab.memory.host_arena import HostArena
    from hopperlab.workloads.inference.kv_cache import (cache_from_layers, cache_nbytes,
                                                         layer_tensors, new_cache)
    from hopperlab.workloads.inference.layered_reload import PinnedHostStore
    from hopperlab.workloads.inference.managed_kv import ManagedStore

    rows = b.results.setdefault("kv", {}).setdefault("rows", [])
    arena = HostArena(pinned=True, chunk_bytes=2**30)
    pinned = PinnedHostStore(rt, arena)
    managed = ManagedStore(rt, allow_oversubscription=False)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)

    def ttft(make_cache: Callable[[], Any], ids: Any, after: Callable[[], None] = lambda: None
             ) -> float:
        rt.synchronize()
        t0 = time.perf_counter()
        cache, reload = make_cache()
        prefill(model, ids, cache).cpu()
        t = time.perf_counter() - t0
        if reload is not None:
            reload.finish(rt)
        after()
        return t

    for ctx in contexts:
        if b.elapsed() > b.budget_s:
            print(f"[budget] kv: context {ctx} not run", flush=True)
            break
        ctx_ids = torch.randint(4, vocab, (1, ctx), generator=g).to(rt.device)
        with torch.inference_mode():
            base = new_cache()
            rt.synchronize()
            t0 = time.perf_counter()
            prefill(model, ctx_ids, base).cpu()
            ctx_prefill_s = time.perf_counter() - t0
            base_layers = [(k, v) for k, v in layer_tensors(base)]
            nbytes = cache_nbytes(base_layers)
            t0 = time.perf_counter()
            host = pinned.save(base_layers)
            rt.synchronize()
            save_s = time.perf_counter() - t0
            mcopy = None
            if managed.allowed(nbytes):
                mcopy = managed.save(base_layers)
                rt.synchronize()
            for turn in turns:
                ids = torch.randint(4, vocab, (1, turn), generator=g).to(rt.device)
                full_ids = torch.cat([ctx_ids, ids], dim=1)
                # warm-up of every path at this shape
                ttft(lambda: (cache_from_layers(base_layers), None), ids)
                ttft(lambda: (new_cache(), None), full_ids)
                for layered in (False, True):
                    ttft(lambda: ((r := pinned.load(host, layered, release=False)).cache, r), ids)
                resident = median_of(repeats, lambda: ttft(
                    lambda: (cache_from_layers(base_layers), None), ids))
                recompute = median_of(repeats, lambda: ttft(lambda: (new_cache(), None),
                                                            full_ids))

                def reload_only() -> float:
                    rt.synchronize()
                    t0 = time.perf_counter()
                    r = pinned.load(host, False, release=False)
                    rt.synchronize()
                    t = time.perf_counter() - t0
                    r.finish(rt)
                    return t

                reload_s = median_of(repeats, reload_only)
                serial = median_of(repeats, lambda: ttft(
                    lambda: ((r := pinned.load(host, False, release=False)).cache, r), ids))
                layered = median_of(repeats, lambda: ttft(
                    lambda: ((r := pinned.load(host, True, release=False)).cache, r), ids))
                managed_s = math.nan
                if mcopy is not None:
                    ttft(lambda: ((r := managed.load(mcopy, True, release=False)).cache, r), ids,
                         after=lambda: (managed.send_to_host(mcopy), rt.synchronize()))
                    managed_s = median_of(repeats, lambda: ttft(
                        lambda: ((r := managed.load(mcopy, True, release=False)).cache, r), ids,
                        after=lambda: (managed.send_to_host(mcopy), rt.synchronize())))
                # correctness: greedy tokens after each reload equal the resident ones
                tokens = {}
                for name, make in (
                        ("resident", lambda: cache_from_layers(base_layers)),
                        ("serial", lambda: pinned.load(host, False, release=False).cache),
                        ("layered", lambda: pinned.load(host, True, release=False).cache)):
                    c = make()
                    tokens[name] = decode(model, prefill(model, ids, c), c, 8).cpu()
                    rt.synchronize()
                same = all(torch.equal(tokens["resident"], t) for t in tokens.values())
                floor_serial = nbytes / (gbps * GB) + resident
                row = {
                    "context": ctx, "turn": turn, "cache_gb": nbytes / GB,
                    "ctx_prefill_ms": ctx_prefill_s * 1e3, "save_ms": save_s * 1e3,
                    "reload_ms": reload_s * 1e3, "reload_gbps": nbytes / reload_s / GB,
                    "resident_ttft_ms": resident * 1e3, "serial_ttft_ms": serial * 1e3,
                    "layered_ttft_ms": layered * 1e3, "managed_ttft_ms": managed_s * 1e3,
                    "recompute_ttft_ms": recompute * 1e3,
                    "floor_serial_ms": floor_serial * 1e3,
                    "serial_over_floor": serial / floor_serial,
                    "recompute_over_serial": recompute / serial,
                    "recompute_over_layered": recompute / layered,
                    "max_reload_prefill_ms": max(nbytes / (gbps * GB), resident) * 1e3,
                    "layered_over_max": layered / max(nbytes / (gbps * GB), resident),
                    "layered_over_sum": layered / floor_serial,
                    "tokens_equal_after_reload": same,
                }
                rows.append(row)
                b.save()
                print(kv_line(row), flush=True)
            if mcopy is not None:
                managed.drop(mcopy)
            pinned.drop(host)
            base = base_layers = None  # the cache goes before the next context
            torch.cuda.empty_cache()


KV_HEAD = (f"{'ctx':>6}{'turn':>6}{'GB':>6}{'reload':>8}{'GB/s':>6}{'resid':>7}{'serial':>8}"
           f"{'floor':>7}{'s/fl':>6}{'layer':>7}{'l/max':>6}{'manag':>7}{'recomp':>8}"
           f"{'rc/se':>6}{'rc/la':>6} same")


def kv_line(r: dict) -> str:
    return (f"{r['context']:>6}{r['turn']:>6}{r['cache_gb']:>6.2f}{r['reload_ms']:>8.1f}"
            f"{r['reload_gbps']:>6.1f}{r['resident_ttft_ms']:>7.1f}{r['serial_ttft_ms']:>8.1f}"
            f"{r['floor_serial_ms']:>7.1f}{r['serial_over_floor']:>6.2f}"
            f"{r['layered_ttft_ms']:>7.1f}{r['layered_over_max']:>6.2f}"
            f"{r['managed_ttft_ms']:>7.1f}{r['recompute_ttft_ms']:>8.1f}"
            f"{r['recompute_over_serial']:>6.2f}{r['recompute_over_layered']:>6.2f} "
            f"{r['tokens_equal_after_reload']}")


# --------------------------------------------------------------------------- determinism
def determinism_section(b: Bench, model: Any, rt: Any, ctx: int, turn: int, runs: int) -> None:
    """Is a bf16 prefill + greedy decode repeatable on this GPU at all? The same cache and turn,
    ``runs`` times resident and after a serial and a layered reload: the reloaded caches are
    compared bit for bit with the saved one, and the first-token logits and the tokens with the
    first resident run. Random weights make near-ties between the top logits common, so a
    non-repeatable kernel shows up as different tokens."""
    import torch

    from hopperlab.workloads.inference.generation import decode, forward_last, prefill
    from hopperlab.memory.host_arena import HostArena
    from hopperlab.workloads.inference.kv_cache import (cache_from_layers, caches_equal,
                                                         layer_tensors, new_cache)
    from hopperlab.workloads.inference.layered_reload import PinnedHostStore

    g = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    ctx_ids = torch.randint(4, vocab, (1, ctx), generator=g).to(rt.device)
    ids = torch.randint(4, vocab, (1, turn), generator=g).to(rt.device)
    store = PinnedHostStore(rt, HostArena(pinned=True, chunk_bytes=2**30))
    out = b.results.setdefault("determinism", {})
    out.update({"context": ctx, "turn": turn,
                "deterministic_algorithms": torch.are_deterministic_algorithms_enabled()})
    with torch.inference_mode():
        base = new_cache()
        prefill(model, ctx_ids, base)
        layers = layer_tensors(base)
        host = store.save(layers)
        rt.synchronize()
        results = []
        for i in range(runs):
            for how in ("resident", "serial", "layered"):
                if how == "resident":
                    cache, equal = cache_from_layers(layers), True
                else:
                    r = store.load(host, how == "layered", release=False)
                    r.finish(rt)
                    cache = r.cache
                    equal = caches_equal(layer_tensors(cache), layers)
                logits = forward_last(model, ids, cache).float()
                tokens = decode(model, logits.argmax(-1, keepdim=True), cache, 16).cpu()
                results.append((how, equal, logits.cpu(), tokens))
        ref_logits, ref_tokens = results[0][2], results[0][3]
        rows = [{"run": i // 3, "how": how, "cache_equal_saved": eq,
                 "logits_max_abs_diff": float((lg - ref_logits).abs().max()),
                 "tokens_equal": bool(torch.equal(tk, ref_tokens))}
                for i, (how, eq, lg, tk) in enumerate(results)]
        top2 = ref_logits[0].topk(2).values
        out.update({"rows": rows, "first_token_top2_gap": float(top2[0] - top2[1])})
        store.drop(host)
    for row in rows:
        print(json.dumps(row), flush=True)


# --------------------------------------------------------------------------- streaming
def stream_section(b: Bench, model: Any, rt: Any, gbps: float, fractions: list[float],
                   batches: list[int], prompt: int, steps: int) -> None:
    import torch

    from hopperlab.memory.host_arena import HostArena
    from hopperlab.workloads.inference.weight_streaming import (LayerStreamer, decoder_layers,
                                                                resident_layer_count)
    from hopperlab.workloads.inference.workload import measure_point

    rows = b.results.setdefault("stream", {}).setdefault("rows", [])
    arena = HostArena(pinned=True, chunk_bytes=2**29)
    n_layers = len(decoder_layers(model))
    vocab = model.config.vocab_size
    for fraction in fractions:
        if b.elapsed() > b.budget_s:
            print(f"[budget] stream: {fraction} not run", flush=True)
            break
        resident = resident_layer_count(n_layers, fraction)
        streamer = LayerStreamer(model, rt, arena, resident).attach()
        streamed = streamer.bytes_per_forward()
        try:
            with torch.inference_mode():
                for batch in batches:
                    m = measure_point(model, rt, batch, prompt, steps, 2, vocab, 0)
                    floor = streamed / (gbps * GB) if streamed else math.nan
                    row = {"streamer": "double-buffer", "resident_fraction": fraction,
                           "batch": batch, "streamed_gb": streamed / GB, **m,
                           "floor_ms_per_token": floor * 1e3,
                           "floor_tokens_per_s": batch / floor if streamed else math.nan,
                           "gpu_mem_gb": torch.cuda.memory_allocated() / GB}
                    row["of_floor"] = row["tokens_per_s"] / row["floor_tokens_per_s"] \
                        if streamed else math.nan
                    rows.append(row)
                    b.save()
                    print(stream_line(row), flush=True)
        finally:
            streamer.detach()
    b.results["stream"]["host_pinned_gb"] = arena.reserved_bytes / GB


def accelerate_section(b: Bench, model: Any, rt: Any, gbps: float, steps: int) -> None:
    import torch

    from hopperlab.workloads.inference.accelerate_peer import dispatch_offloaded
    from hopperlab.workloads.inference.weight_streaming import decoder_layers
    from hopperlab.workloads.inference.workload import measure_point

    rows = b.results.setdefault("stream", {}).setdefault("rows", [])
    n = len(decoder_layers(model))
    model, streamed = dispatch_offloaded(model, rt, n // 2)
    with torch.inference_mode():
        m = measure_point(model, rt, 1, 64, steps, 1, model.config.vocab_size, 0)
    floor = streamed / (gbps * GB)
    row = {"streamer": "accelerate", "resident_fraction": 0.5, "batch": 1,
           "streamed_gb": streamed / GB, **m, "floor_ms_per_token": floor * 1e3,
           "floor_tokens_per_s": 1 / floor, "gpu_mem_gb": torch.cuda.memory_allocated() / GB}
    row["of_floor"] = row["tokens_per_s"] / row["floor_tokens_per_s"]
    rows.append(row)
    print(stream_line(row), flush=True)


STREAM_HEAD = (f"{'streamer':<14}{'res':>5}{'B':>4}{'GB/fw':>7}{'prefill':>9}{'ms/tok':>8}"
               f"{'tok/s':>9}{'floor':>8}{'of_fl':>7}{'GPU GB':>8}")


def stream_line(r: dict) -> str:
    return (f"{r['streamer']:<14}{r['resident_fraction']:>5.2f}{r['batch']:>4}"
            f"{r['streamed_gb']:>7.2f}{r['prefill_ms']:>9.1f}{r['decode_ms_per_token']:>8.1f}"
            f"{r['tokens_per_s']:>9.2f}{r['floor_tokens_per_s']:>8.2f}{r['of_floor']:>7.2f}"
            f"{r['gpu_mem_gb']:>8.1f}")


# --------------------------------------------------------------------------- workload
def workload_section(b: Bench, out: Path, only: set[str] | None = None) -> None:
    """The kv-cache variants through the job body (model built in each run)."""
    import torch

    from hopperlab.core.rundir import Recorder
    from hopperlab.workloads.inference import InferenceParams
    from hopperlab.workloads.base import fake_run
    from hopperlab.workloads.inference.workload import run

    out = out / "runs" / "kv"  # run folders stay on the machine; their figures are in the JSON
    asset = out / "llama-2-7b-random"
    asset.mkdir(parents=True, exist_ok=True)
    (asset / "config.json").write_text(CONFIG.read_text())
    (asset / "ASSET.json").write_text(json.dumps({"name": "llama-2-7b-random",
                                                  "weights": "random"}))
    rows = b.results.setdefault("workload", {}).setdefault("rows", [])
    base = dict(study="kv-cache", sessions=4, rounds=3, context_tokens=4096, turn_tokens=128,
                reply_tokens=16, gpu_sessions=1, warmup=1, dtype="bfloat16")
    variants = [("resident", "device", {"policy": "resident"}),
                ("offload", "device", {"policy": "offload"}),
                ("offload-serial", "device", {"policy": "offload", "layered_reload": False}),
                ("recompute", "device", {"policy": "recompute"}),
                ("managed", "managed", {"policy": "offload"})]
    replies = {}
    for name, memory, extra in variants:
        if only and name not in only:
            continue
        if b.elapsed() > b.budget_s:
            print(f"[budget] workload {name}: not run", flush=True)
            break
        spec = fake_run(InferenceParams(**base, **extra), scale="full", gpus=1, cpus=8,
                        run_dir=out / f"kv-{name}", assets={"model": asset},
                        family="inference", experiment="kv-cache", variant=name, memory=memory)
        rec = Recorder(out / f"kv-{name}", identity={"key": f"inference/kv-cache/{name}"})
        try:
            run(spec, rec)
            r = rec.finish("ok")
            replies[name] = json.loads((out / f"kv-{name}" / "artifacts" /
                                        "replies.json").read_text())
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            r = rec.finish("failed", f"{type(exc).__name__}: {exc}"[:500])
        torch.cuda.empty_cache()
        m = r["metrics"]
        row = {"variant": name, "status": r["status"], **{k: m.get(k) for k in (
            "ttft_ms_p50", "ttft_ms_p99", "decode_tokens_per_s", "reload_gbps", "reload_bytes",
            "gpu_cache_bytes_peak", "host_cache_bytes_peak", "sessions_served",
            "model_load_s")}}
        if name in replies and "resident" in replies:
            row["replies_equal_resident"] = replies[name] == replies["resident"]
        rows.append(row)
        b.save()
        print(json.dumps(row), flush=True)


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=330.0)
    ap.add_argument("--contexts", default="1024,4096,16384")
    ap.add_argument("--turns", default="128,1024")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fractions", default="1.0,0.75,0.5,0.25")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--accelerate-steps", type=int, default=4)
    ap.add_argument("--workload", action="store_true", help="also the job-body kv variants")
    ap.add_argument("--workload-variants", default="", help="comma-separated; empty: all")
    ap.add_argument("--determinism", action="store_true",
                    help="repeat one prefill + decode resident and after reloads")
    ap.add_argument("--deterministic", action="store_true",
                    help="torch.use_deterministic_algorithms(True) (set CUBLAS_WORKSPACE_CONFIG)")
    ap.add_argument("--skip", default="", help="comma-separated sections to leave out")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))

    import torch
    import transformers

    from hopperlab.node import hardware
    from hopperlab.assets import build_random_model
    from hopperlab.workloads.inference.runtime import measure_pinned_h2d_gbps, probe

    b = Bench(args.out, args.budget_s)
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    torch.cuda.init()
    fp = hardware.fingerprint()
    b.results["machine"] = {**fp, "transformers": transformers.__version__,
                            "torch": torch.__version__}
    print(hardware.summary_line(fp), "| transformers", transformers.__version__, flush=True)
    rt = probe(torch)
    if not rt.is_cuda:
        print("no CUDA device:", rt.no_cuda_reason)
        return 2

    def link() -> float:
        g = measure_pinned_h2d_gbps(rt, nbytes=2**30, repeats=5)
        b.results["link"] = {"pinned_h2d_gbps": g}
        print(f"pinned H2D {g:.1f} GB/s (1 GiB, median of 5)", flush=True)
        return g

    gbps = b.section("link", link)
    if not gbps:
        return 1

    def build() -> Any:
        t = time.perf_counter()
        model, n = build_random_model(CONFIG, "cuda", seed=0)
        model.eval()
        b.results["model"] = {"parameters": n, "build_s": time.perf_counter() - t,
                              "gpu_gb": torch.cuda.memory_allocated() / GB}
        print(f"model: {n / 1e9:.2f} B parameters in {time.perf_counter() - t:.1f}s", flush=True)
        return model

    model = b.section("model", build)
    if model is None:
        return 1
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    if args.determinism:
        b.section("determinism", lambda: determinism_section(b, model, rt, 1024, 1024, 3))
    if "kv" not in skip:
        print(KV_HEAD, flush=True)
        b.section("kv", lambda: kv_section(b, model, rt, gbps, ints(args.contexts),
                                           ints(args.turns), args.repeats))
    if "stream" not in skip:
        print(STREAM_HEAD, flush=True)
        b.section("stream", lambda: stream_section(
            b, model, rt, gbps, [float(x) for x in args.fractions.split(",")],
            ints(args.batches), args.prompt, args.steps))
    if "accelerate" not in skip:
        b.section("accelerate", lambda: accelerate_section(b, model, rt, gbps,
                                                           args.accelerate_steps))
    model = None  # accelerate hooks hold it; the job-body runs build their own
    torch.cuda.empty_cache()
    if args.workload:
        b.section("workload", lambda: workload_section(
            b, args.out, set(filter(None, args.workload_variants.split(","))) or None))

    # the short tables last (the reply carries the end of the output)
    print("\n== kv (ms; GB = 1e9 B; median of", args.repeats, ")")
    print(KV_HEAD)
    for r in b.results.get("kv", {}).get("rows", []):
        print(kv_line(r))
    print("\n== stream (decode; floor = streamed bytes / pinned GB/s)")
    print(STREAM_HEAD)
    for r in b.results.get("stream", {}).get("rows", []):
        print(stream_line(r))
    for r in b.results.get("workload", {}).get("rows", []):
        print(json.dumps(r))
    print(f"pinned H2D {gbps:.1f} GB/s; total {b.elapsed():.0f}s")
    b.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
