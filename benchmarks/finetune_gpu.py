"""The finetune family's GPU benchmark (docs/benchmarks/finetune.md): random-weight Llama shapes,
batch 4 x 2048, through the family's own ``prepare`` and ``train`` (what ``run_torch`` runs),
with the variants' knobs and params, and other projects' pieces put in through that seam.

    PYTHONPATH=src python3 benchmarks/finetune_gpu.py --suite lora7b --out DIR
    suites: lora7b (baseline, checkpointing, save_on_cpu, async offload of everything, 40 GiB
            budget, checkpointing + offload, num_workers 0/4 with tokenization in the loader,
            torchtune's OffloadActivations), managed (memory: managed, in a fresh process),
            fp8 (full-1b bf16 eager / compile / fp8; LoRA-7B bf16+compile / fp8; full-7b
            and torchao's CPUOffloadOptimizer), 70b (LoRA-70B, parameter + activation offload,
            as many layers as the host's memory holds), liger (Liger Kernel's kernels: none,
            all, each alone, all but each)

Every variant appends one JSON line to DIR/results.jsonl and the script prints a table. The
pinned host<->device bandwidth of the node is measured first (1 GiB copies, median of 5) for
the floors. torchtune and torchao are optional (carried wheels): their comparisons are skipped,
and say so, when the import fails.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from dataclasses import asdict, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hopperlab.core.rundir import Recorder, SkipRun  # noqa: E402
from hopperlab.workloads.finetune import FinetuneParams  # noqa: E402
from hopperlab.workloads.base import Knobs, fake_run  # noqa: E402

GIB = float(1 << 30)
MODELS = {"7b": ROOT / "models/llama-2-7b", "70b": ROOT / "models/llama-2-70b",
          "1b": ROOT / "models/llama-1b"}
#: --variants: run only these variant names (empty: all of the suite)
ONLY_VARIANTS: set[str] = set()
LORA7B = FinetuneParams(method="lora", weights="random", dtype="bfloat16", seq_len=2048,
                        micro_batch=4, lora_rank=32, lora_alpha=64, data="synthetic",
                        warmup_steps=2, measured_steps=6, learning_rate=1e-4)


def spec_for(model: str, knobs: Knobs, params: FinetuneParams, assets: dict[str, Path]) -> Any:
    paths = {"model": MODELS[model], **assets}
    return fake_run(params, gpus=1, assets=paths, run_dir=tempfile.mkdtemp(prefix="ft-"),
                    family="finetune", **asdict(knobs))


def pinned_bandwidth_gbps() -> dict[str, float]:
    """GB/s (1e9) of 1 GiB copies between pinned host memory and the GPU, median of 5."""
    import torch

    from hopperlab.cuda.link import pinned_copy_gbps

    host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    out = {d: pinned_copy_gbps("cuda", d, 1 << 30, host=host) for d in ("h2d", "d2h")}
    del host
    torch.cuda.empty_cache()
    return out


def free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_with_peers(spec: Any, params: FinetuneParams, rec: Recorder, *,
                   forward_context: Callable[[], Any] | None = None,
                   make_optimizer: Callable[[list[Any]], Any] | None = None,
                   adapt_model: Callable[[Any, Any], Any] | None = None) -> dict[str, float]:
    """The family's run with other projects' pieces in place of its own: ``adapt_model(model,
    layers)`` changes the prepared model, ``make_optimizer(trainable)`` and ``forward_context``
    (entered around each forward) replace the family's; none given is ``run_torch``."""
    from hopperlab.workloads.finetune.torch.workload import prepare, train

    job = prepare(spec, params, rec)
    if adapt_model is not None:
        job.adapt(adapt_model)
    optimizer = make_optimizer(job.trainable()) if make_optimizer is not None else None
    return train(job, optimizer=optimizer, forward_context=forward_context)


def run_variant(out: Path, suite: str, name: str, model: str, params: FinetuneParams,
                knobs: Knobs = Knobs(), assets: dict[str, Path] | None = None,
                **inject: Any) -> dict[str, Any]:
    """One variant through the family's prepare and train; a JSON line in out/results.jsonl."""
    import torch

    if ONLY_VARIANTS and name not in ONLY_VARIANTS:
        return {}
    spec = spec_for(model, knobs, params, assets or {})
    rec = Recorder(Path(spec.run_dir))
    t0 = time.time()
    row: dict[str, Any] = {"suite": suite, "variant": name, "model": model}
    try:
        run_with_peers(spec, params, rec, **inject)
        row["status"] = "ok"
    except SkipRun as exc:
        row.update(status="skipped", reason=str(exc))
    except Exception as exc:  # noqa: BLE001 - an OOM is a result; keep going
        oom = "out of memory" in str(exc).lower() or isinstance(exc, torch.cuda.OutOfMemoryError)
        row.update(status="oom" if oom else "failed", reason=f"{type(exc).__name__}: {exc}"[:400])
        if not oom:
            traceback.print_exc()
    row["wall_s"] = round(time.time() - t0, 1)
    row["metrics"] = dict(rec.metrics)
    row["tags"] = dict(rec.tags)
    rec.finish("ok")
    row["left_allocated_gib"] = left_allocated_gib()
    with open(out / "results.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")
    m = row["metrics"]
    print(f"{suite:8} {name:28} {row['status']:7} tok/s {m.get('tokens_per_s', 0):9.0f}  "
          f"p50 {m.get('step_time_p50_s', 0):7.3f}s  peak alloc "
          f"{m.get('peak_gpu_allocated_gib', 0):6.1f} GiB  reserved "
          f"{m.get('peak_gpu_reserved_gib', 0):6.1f}  to-host "
          f"{m.get('bytes_to_host_per_step', 0) / 1e9:6.2f} GB  mfu {m.get('mfu', 0):.3f}  "
          f"wait {m.get('data_wait_fraction', 0):.4f}  fwd/bwd/opt "
          f"{m.get('forward_s_per_step', 0):.3f}/{m.get('backward_s_per_step', 0):.3f}/"
          f"{m.get('optimizer_s_per_step', 0):.3f}s  mallocs/frees/retries "
          f"{m.get('allocator_device_mallocs_per_step', 0):.1f}/"
          f"{m.get('allocator_device_frees_per_step', 0):.1f}/"
          f"{m.get('allocator_retries_per_step', 0):.1f}  loss {m.get('first_loss', 0):.3f}->"
          f"{m.get('final_loss', 0):.3f}  ({row['wall_s']} s) {row.get('reason', '')[:200]}",
          flush=True)
    return row


def left_allocated_gib() -> float:
    """GPU memory still allocated once a variant is over and collected: a next variant's
    figures (and its budget) would include it, so it is printed, with the largest tensors."""
    import torch

    free_memory()
    if not torch.cuda.is_available():
        return 0.0
    left = torch.cuda.memory_allocated() / GIB
    if left > 0.25:
        live = sorted(((o.numel() * o.element_size(), tuple(o.shape), str(o.dtype))
                       for o in gc.get_objects()
                       if isinstance(o, torch.Tensor) and o.is_cuda), reverse=True)
        print(f"WARNING: {left:.2f} GiB still allocated after the variant; "
              f"{len(live)} CUDA tensors reachable, largest: {live[:5]}", flush=True)
    return round(left, 3)


# ----------------------------------------------------------------------------- comparisons
def torchtune_offload() -> Callable[[], Any] | None:
    """torchtune 0.6.1's OffloadActivations, loaded from its wheel's file alone: the rest of
    torchtune needs datasets, omegaconf, kagglehub, ... that the GPU image lacks. The two names
    the file imports from torchtune (TiedLinear, get_logger) are given stand-ins."""
    import logging

    wheels = sorted((ROOT / ".whl-finetune").glob("torchtune-*.whl"))
    if not wheels:
        print("torchtune: no wheel in .whl-finetune: comparison skipped")
        return None
    import importlib.util

    if importlib.util.find_spec("torchao") is None:  # the file imports torchao.dtypes
        print("torchtune: needs torchao, which is not installed: comparison skipped")
        return None
    source = zipfile.ZipFile(wheels[0]).read("torchtune/training/_activation_offloading.py")
    pkg, modules, utils = (ModuleType(n) for n in ("torchtune", "torchtune.modules",
                                                   "torchtune.utils"))
    modules.TiedLinear = type("TiedLinear", (), {})  # type: ignore[attr-defined]
    # torchtune 0.6.1 imports NF4Tensor (for an isinstance check on QLoRA weights) from a
    # module torchao 0.18 no longer has; no weight here is NF4, so a stand-in class serves
    try:
        import torchao.dtypes.nf4tensor  # noqa: F401
    except ImportError:
        nf4 = ModuleType("torchao.dtypes.nf4tensor")
        nf4.NF4Tensor = type("NF4Tensor", (), {})  # type: ignore[attr-defined]
        sys.modules["torchao.dtypes.nf4tensor"] = nf4
    utils.get_logger = lambda level="INFO": logging.getLogger("torchtune")  # type: ignore
    sys.modules.update({"torchtune": pkg, "torchtune.modules": modules, "torchtune.utils": utils})
    mod = ModuleType("torchtune_activation_offloading")
    exec(compile(source, "torchtune/training/_activation_offloading.py", "exec"), mod.__dict__)
    ctx = mod.OffloadActivations(use_pin_memory=True, use_streams=True)

    def factory() -> Any:
        return ctx
    factory.__name__ = "torchtune.OffloadActivations"
    return factory


def torchao_cpu_offload_optimizer(lr: float) -> Callable[[Any], Any] | None:
    try:
        from torchao.optim import CPUOffloadOptimizer
    except ImportError as exc:
        print(f"torchao: {exc}: CPUOffloadOptimizer comparison skipped")
        return None
    import torch

    def make(params: Any) -> Any:
        return CPUOffloadOptimizer(params, torch.optim.AdamW, offload_gradients=True, lr=lr,
                                   fused=True)
    return make


def accelerate_frozen_offload() -> Callable[[Any, Any], Any] | None:
    """The public peer of the parameter offload: Hugging Face accelerate's ``cpu_offload`` on
    every frozen linear module of the decoder layers (LoRA's base projections and the MLP).
    accelerate keeps their weights in (pageable) host memory and copies each to the GPU in a
    hook before its forward, synchronously, nothing ahead of use. Offloading whole layers, as
    it would for inference, puts the adapters on ``meta`` too: they get no gradient (tried on
    the tiny model, accelerate 1.15: 0 of 16). With checkpointing, backward's recomputation
    fetches the weights again, so the memory of a layer's weights is held for one layer."""
    try:
        from accelerate import cpu_offload
    except ImportError as exc:
        print(f"accelerate: {exc}: parameter-offload comparison skipped")
        return None
    import torch

    def adapt(model: Any, layers: Any) -> Any:
        streamed = 0
        for layer in layers:
            for module in list(layer.modules()):
                if isinstance(module, torch.nn.Linear) and not module.weight.requires_grad:
                    streamed += sum(t.numel() * t.element_size() for t in module.parameters())
                    cpu_offload(module, execution_device=torch.device("cuda", 0))
        torch.cuda.empty_cache()
        # forward and checkpointing's recomputation each fetch every offloaded weight
        print(f"accelerate: {streamed / 1e9:.2f} GB of frozen weights on the host, "
              f"{2 * streamed / 1e9:.2f} GB copied to the GPU a step", flush=True)
        return model
    adapt.__name__ = "accelerate.cpu_offload(frozen linears)"
    return adapt


# ----------------------------------------------------------------------------- suites
def suite_lora7b(out: Path, args: argparse.Namespace) -> None:
    """In order of what matters most (a command cut short by its time limit keeps the first)."""
    p = replace(LORA7B, measured_steps=args.steps, warmup_steps=args.warmup)
    run_variant(out, "lora7b", "baseline", "7b", p)
    run_variant(out, "lora7b", "offload-activations", "7b", p, Knobs(offload="activations"))
    run_variant(out, "lora7b", "save-on-cpu", "7b",
                replace(p, activation_offload="save_on_cpu", measured_steps=3),
                Knobs(offload="activations"))
    run_variant(out, "lora7b", "offload-budget-40", "7b", replace(p, offload_budget_gib=40.0),
                Knobs(offload="activations"))
    for keep in (1, 2):  # everything but what backward needs first (memory.activation_offload)
        run_variant(out, "lora7b", f"offload-keep-last-{keep}", "7b",
                    replace(p, offload_keep_last_layers=keep), Knobs(offload="activations"))
    # recompute_elementwise (memory.recompute_elementwise): the same variants saving 23% less
    lean = replace(p, recompute_elementwise=True)
    run_variant(out, "lora7b", "baseline-recompute", "7b", lean)
    run_variant(out, "lora7b", "offload-activations-recompute", "7b", lean,
                Knobs(offload="activations"))
    run_variant(out, "lora7b", "save-on-cpu-recompute", "7b",
                replace(lean, activation_offload="save_on_cpu", measured_steps=3),
                Knobs(offload="activations"))
    # the technique's own cost, the host link taken out: the copies go to GPU memory
    # (offload_staging: device), and the hooks with nothing offloaded (min_bytes above all)
    run_variant(out, "lora7b", "offload-activations-recompute-device-staging", "7b",
                replace(lean, offload_staging="device"), Knobs(offload="activations"))
    run_variant(out, "lora7b", "offload-hooks-only-recompute", "7b",
                replace(lean, offload_min_bytes=1 << 62), Knobs(offload="activations"))
    run_variant(out, "lora7b", "offload-keep-last-1-recompute", "7b",
                replace(lean, offload_keep_last_layers=1), Knobs(offload="activations"))
    for mib in (1024, 256):     # how far the copies may lag forward
        tag = "" if mib == 1024 else f"-inflight-{mib}"
        run_variant(out, "lora7b", f"offload-keep-head-recompute{tag}", "7b",
                    replace(lean, offload_keep_head=True, offload_max_inflight_mib=mib),
                    Knobs(offload="activations"))
        if mib != 1024:
            run_variant(out, "lora7b", f"offload-activations-recompute{tag}", "7b",
                        replace(lean, offload_max_inflight_mib=mib), Knobs(offload="activations"))
    run_variant(out, "lora7b", "offload-keep-head", "7b", replace(p, offload_keep_head=True),
                Knobs(offload="activations"))
    for mib in (256, 128):
        run_variant(out, "lora7b", f"offload-keep-head-inflight-{mib}", "7b",
                    replace(p, offload_keep_head=True, offload_max_inflight_mib=mib),
                    Knobs(offload="activations"))
    run_variant(out, "lora7b", "offload-budget-40-recompute", "7b",
                replace(lean, offload_budget_gib=40.0, expandable_segments=True),
                Knobs(offload="activations"))
    run_variant(out, "lora7b", "offload-budget-40-expandable", "7b",
                replace(p, offload_budget_gib=40.0, expandable_segments=True),
                Knobs(offload="activations"))
    # the chunked loss (memory.chunked_cross_entropy): no whole-batch float32 logits
    chunked = replace(lean, loss_chunk_tokens=1024)
    run_variant(out, "lora7b", "baseline-chunked", "7b", replace(p, loss_chunk_tokens=1024))
    run_variant(out, "lora7b", "baseline-recompute-chunked", "7b", chunked)
    run_variant(out, "lora7b", "offload-budget-40-recompute-chunked", "7b",
                replace(chunked, offload_budget_gib=40.0, expandable_segments=True),
                Knobs(offload="activations"))
    run_variant(out, "lora7b", "offload-budget-40-recompute-chunked-capped", "7b",
                replace(chunked, offload_budget_gib=40.0, expandable_segments=True,
                        offload_budget_caps_allocator=True), Knobs(offload="activations"))
    run_variant(out, "lora7b", "offload-budget-40-recompute-chunked-capped-plain", "7b",
                replace(chunked, offload_budget_gib=40.0, offload_budget_caps_allocator=True),
                Knobs(offload="activations"))
    run_variant(out, "lora7b", "offload-budget-38-recompute-chunked", "7b",
                replace(chunked, offload_budget_gib=38.0, expandable_segments=True),
                Knobs(offload="activations"))
    run_variant(out, "lora7b", "offload-budget-40-chunked", "7b",
                replace(p, loss_chunk_tokens=1024, offload_budget_gib=40.0,
                        expandable_segments=True), Knobs(offload="activations"))
    run_variant(out, "lora7b", "save-on-cpu-recompute-chunked", "7b",
                replace(chunked, activation_offload="save_on_cpu", measured_steps=3),
                Knobs(offload="activations"))
    run_variant(out, "lora7b", "offload-keep-head-recompute-chunked-inflight-256", "7b",
                replace(chunked, offload_keep_head=True, offload_max_inflight_mib=256),
                Knobs(offload="activations"))
    run_variant(out, "lora7b", "offload-budget-17", "7b", replace(p, offload_budget_gib=17.0),
                Knobs(offload="activations"))
    run_variant(out, "lora7b", "checkpointing", "7b", replace(p, checkpointing=True))
    data = {"records": ROOT / "assets/dolly-synthetic", "tokenizer": ROOT / "assets/tiny-tokenizer"}
    if all(v.is_dir() for v in data.values()):
        for workers in (0, 4):
            run_variant(out, "lora7b", f"tokenize-workers-{workers}", "7b",
                        replace(p, data="tokenize"), Knobs(num_workers=workers), data)
    else:
        print("num_workers: assets/dolly-synthetic and assets/tiny-tokenizer not carried: skipped")
    run_variant(out, "lora7b", "checkpointing-offload", "7b", replace(p, checkpointing=True),
                Knobs(offload="activations"))
    tt = torchtune_offload() if not ONLY_VARIANTS or "torchtune-offload" in ONLY_VARIANTS else None
    if tt is not None:
        run_variant(out, "lora7b", "torchtune-offload", "7b", p, forward_context=tt)


def suite_liger(out: Path, args: argparse.Namespace) -> None:
    """Liger Kernel's kernels (param ``liger``), none, each alone, all, and all but each, on
    the LoRA-7B baseline: which of them pays (docs/benchmarks/finetune.md, issue 51)."""
    from hopperlab.workloads.finetune import LIGER_KERNELS

    p = replace(LORA7B, measured_steps=args.steps, warmup_steps=args.warmup)
    run_variant(out, "liger", "liger-none", "7b", replace(p, liger=()))
    run_variant(out, "liger", "liger-all", "7b", replace(p, liger=LIGER_KERNELS))
    for k in LIGER_KERNELS:
        run_variant(out, "liger", f"liger-{k}", "7b", replace(p, liger=(k,)))
    for k in LIGER_KERNELS:
        run_variant(out, "liger", f"liger-all-but-{k}", "7b",
                    replace(p, liger=tuple(x for x in LIGER_KERNELS if x != k)))


def suite_managed(out: Path, args: argparse.Namespace) -> None:
    """memory: managed must be installed before CUDA starts: a fresh process."""
    p = replace(LORA7B, measured_steps=args.steps, warmup_steps=args.warmup)
    run_variant(out, "managed", "lora7b-managed", "7b", p, Knobs(memory="managed"))


def suite_fp8(out: Path, args: argparse.Namespace) -> None:
    full1b = replace(LORA7B, method="full", measured_steps=args.steps, warmup_steps=args.warmup + 1)
    run_variant(out, "fp8", "full1b-bf16-eager", "1b", full1b)
    run_variant(out, "fp8", "full1b-bf16-compile", "1b", replace(full1b, compile=True))
    run_variant(out, "fp8", "full1b-fp8-compile", "1b", full1b, Knobs(precision="fp8"))
    lora = replace(LORA7B, measured_steps=args.steps, warmup_steps=args.warmup + 1)
    run_variant(out, "fp8", "lora7b-fp8-compile", "7b", lora, Knobs(precision="fp8"))
    run_variant(out, "fp8", "lora7b-bf16-compile", "7b", replace(lora, compile=True))
    make = torchao_cpu_offload_optimizer(full1b.learning_rate)
    if make is not None:
        run_variant(out, "fp8", "full1b-torchao-cpu-offload-optim", "1b", full1b,
                    make_optimizer=make)
    if args.full7b:
        full7b = replace(LORA7B, method="full", measured_steps=3, warmup_steps=1,
                         learning_rate=1e-5)
        run_variant(out, "fp8", "full7b-baseline", "7b", full7b)
        if make is not None:
            run_variant(out, "fp8", "full7b-ckpt-torchao-cpu-offload-optim", "7b",
                        replace(full7b, checkpointing=True), make_optimizer=make)


def host_layers_that_fit(reserve_gib: float) -> tuple[int, float]:
    """How many 70B decoder layers fit into the host's available memory, keeping
    ``reserve_gib`` for everything else; each layer's frozen weights take one pinned buffer of
    exactly their size (ParameterOffload registers plain host memory, no power-of-two
    rounding)."""
    import json as _json

    import psutil

    cfg = _json.loads((MODELS["70b"] / "config.json").read_text())
    d, f = cfg["hidden_size"], cfg["intermediate_size"]
    kv = d // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    layer_bytes = 2 * (2 * d * d + 2 * d * kv + 3 * d * f)
    avail = psutil.virtual_memory().available / GIB
    n = int((avail - reserve_gib) // (layer_bytes / GIB))
    return max(1, min(n, cfg["num_hidden_layers"])), layer_bytes / GIB


def suite_70b(out: Path, args: argparse.Namespace) -> None:
    n, layer_gib = host_layers_that_fit(args.host_reserve_gib)
    if args.layers:
        n = min(n, args.layers)
    print(f"70b: {n} of 80 layers ({layer_gib:.2f} GiB of frozen bf16 weights each)", flush=True)
    p = replace(LORA7B, micro_batch=1, num_layers=n, checkpointing=True, resident_layers=0,
                prefetch_layers=1, measured_steps=args.steps_70b, warmup_steps=1)
    run_variant(out, "70b", f"lora70b-offload-both-{n}layers", "70b", p, Knobs(offload="both"))
    peer = accelerate_frozen_offload()
    if peer is not None:   # the same layers on the GPU at first, then accelerate takes them
        run_variant(out, "70b", f"lora70b-accelerate-offload-{n}layers", "70b", p, Knobs(),
                    adapt_model=peer)


SUITES = {"lora7b": suite_lora7b, "liger": suite_liger, "managed": suite_managed,
          "fp8": suite_fp8, "70b": suite_70b}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", action="append", choices=sorted(SUITES), required=True)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/finetune-gpu")))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps-70b", type=int, default=3)
    ap.add_argument("--layers", type=int, default=0, help="70b: at most this many layers")
    ap.add_argument("--host-reserve-gib", type=float, default=24.0)
    ap.add_argument("--full7b", action="store_true", help="fp8 suite: also full-7b runs")
    ap.add_argument("--in-subprocess", action="store_true",
                    help="run each suite in its own python process (managed needs one)")
    ap.add_argument("--no-autocast", action="store_true",
                    help="forward without bf16 autocast (the adapters in float32), as the "
                         "figures of docs/benchmarks/finetune.md were taken")
    ap.add_argument("--variants", default="", help="comma-separated variant names to run "
                                                    "(default: every variant of the suites)")
    args = ap.parse_args()
    ONLY_VARIANTS.update(v for v in args.variants.split(",") if v)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.no_autocast:
        global LORA7B
        LORA7B = replace(LORA7B, autocast=False)
    import torch

    # memory: managed must find CUDA uninitialised: no device query before its suite runs
    print(f"torch {torch.__version__}"
          + ("" if "managed" in args.suite else f", {torch.cuda.get_device_name(0)}"), flush=True)
    if args.in_subprocess and len(args.suite) > 1:
        for suite in args.suite:
            cmd = [sys.executable, __file__, "--suite", suite, "--out", str(args.out),
                   "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--steps-70b", str(args.steps_70b), "--layers", str(args.layers),
                   "--host-reserve-gib", str(args.host_reserve_gib)] + \
                (["--full7b"] if args.full7b else []) + \
                (["--no-autocast"] if args.no_autocast else [])
            subprocess.run(cmd, check=False)
        return 0
    if args.suite != ["managed"]:
        bw = pinned_bandwidth_gbps()
        print(f"pinned bandwidth: h2d {bw['h2d']:.1f} GB/s, d2h {bw['d2h']:.1f} GB/s", flush=True)
        with open(args.out / "results.jsonl", "a") as fh:
            fh.write(json.dumps({"suite": "bandwidth", "variant": "pinned-1GiB",
                                 "metrics": bw}) + "\n")
    for suite in args.suite:
        SUITES[suite](args.out, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
