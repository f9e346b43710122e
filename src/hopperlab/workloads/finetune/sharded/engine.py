"""Full fine-tuning of a Llama shape sharded over the run's ranks: FSDP2 (``fully_shard``), FSDP2
with ``CPUOffloadPolicy`` (parameters, gradients and AdamW states in host memory, the optimizer
step on the CPU: the role DeepSpeed's ZeRO-Offload plays in the source), and torchao's
``CPUOffloadOptimizer`` as the one-GPU peer.

The model is our own small Llama (``llama.py``) with random weights and random tokens as data.
Every variant is built on the meta device and each rank materialises its own shard
only, drawn where it will live (``shard_init``): the same seed gives the same model and batches
whatever the world size, so a sharded step can be checked against one process
(tests/workloads/test_distributed_workloads.py). Each run logs its step against the step's floor
(``step_floor``): GPU compute measured alone on a probe, host-link bytes at the measured pinned
rate, the optimizer step.
"""

from __future__ import annotations

import math
import resource
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hopperlab.core.rundir import SkipRun
from hopperlab.cuda.nvtx import measured_region
from hopperlab.memory import caching_allocator, cpu_adamw, h2d_prefetch
from hopperlab.memory.pinned import pinned_empty
from hopperlab.workloads.base import Recording
from hopperlab.workloads.finetune.sharded import shard_init, step_floor, step_profile
from hopperlab.workloads.finetune.sharded.llama import (CPU_COMPILE_BACKEND, Llama, Shape,
                                                        build_model, compile_layers, keep_mlp_up)
from hopperlab.workloads.finetune.sharded.memory_fit import MlpUpFitting, check_host_memory
from hopperlab.workloads.finetune.sharded.plan import Plan
from hopperlab.workloads.finetune.sharded.rates import (finite, floor_of, gpu_memory_figures,
                                                        matmul_rate_tflops,
                                                        model_flops_per_token, pinned_host_gb,
                                                        slowest_p50s, step_figures)
from hopperlab.workloads.finetune.sharded.rates import is_cuda as _is_cuda


def build_sharded(shape: Shape, dtype: Any, mode: str, seed: int, device: Any, cuda: bool,
                  checkpointing: bool = False, host_alloc: Callable[[int], Any] | None = None,
                  reshard_after_forward: bool = True,
                  timings: dict[str, float] | None = None) -> tuple[Llama, list[Any]]:
    """This rank's part of the model of ``seed``, never the whole of it on any rank.

    FSDP2 modes: built on the meta device, sharded there, then only this rank's shard gets
    memory and values, drawn on ``device`` (the GPU when there is one). Under CPU offload the
    shard lives in host memory: in buffers of ``host_alloc`` (default with a GPU: exact-size
    pinned, ``memory.pinned``). torchao: the whole model on ``device``.
    ``reshard_after_forward``: FSDP2's option for the decoder layers (``shard``).
    ``timings`` (filled where given): seconds of ``build_alloc_s`` (storage, pinned or not)
    and ``build_init_s`` (drawing the values), so that a slow build says which.
    Returns the model and the host buffers it lives in (keep them as long as the model)."""
    if not mode.startswith("fsdp2"):
        return build_model(shape, dtype, device, seed, checkpointing), []
    model = Llama(shape, dtype, "meta", checkpointing)
    shard(model, mode, cuda, reshard_after_forward)
    offload = mode == "fsdp2-cpu-offload"
    if offload and host_alloc is None and cuda and pinned_empty(4096).is_pinned():
        host_alloc = pinned_empty  # else FSDP2 would copy the shards into pinned memory of its own
    t0 = time.perf_counter()
    bases = shard_init.materialise(model, "cpu" if offload else device,
                                   host_alloc if offload else None)
    t1 = time.perf_counter()
    shard_init.init_weights(model, seed, device)
    if cuda:
        torch.cuda.synchronize()
    if timings is not None:
        timings.update(build_alloc_s=t1 - t0, build_init_s=time.perf_counter() - t1)
    return model, bases


#: PyTorch's pinned host allocator (FSDP2's offloaded gradients, torchao's copies): plain
#: memory whose pages 8 threads touch, then ``cudaHostRegister``; by default ``cudaHostAlloc``
#: faults and clears every page on one thread (about 0.5 GB/s: most of the 51-81 s first steps
#: of the 2026-11-28 offload runs, issue 35)
PINNED_ALLOC_SETTINGS = "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"


def fast_pinning() -> str:
    """Switch the pinned host allocator to ``PINNED_ALLOC_SETTINGS`` (read at each new block);
    returns what the run's blocks are made with, for its record."""
    try:
        torch.cuda.memory._set_allocator_settings(PINNED_ALLOC_SETTINGS)
    except (RuntimeError, AttributeError, ValueError) as exc:
        return f"cudaHostAlloc (the settings were refused: {type(exc).__name__}: {exc})"[:250]
    return "malloc, pages touched by 8 threads, cudaHostRegister"


def compile_model(model: Llama, plan: Plan, cuda: bool) -> dict[str, str]:
    """Compile ``model``'s decoder layers where ``plan.compile`` says so; returns the tags that
    say what the run got (a CPU run traces with dynamo's eager backend: no kernels made)."""
    if not plan.compile:
        return {"finetune.compile": "false"}
    backend = "inductor" if cuda else CPU_COMPILE_BACKEND
    n = compile_layers(model, backend)
    tags = {"finetune.compile": f"each decoder layer ({n}, {backend}, checkpoint inside)"}
    if not cuda:
        tags["finetune.compile_skipped"] = ("inductor code generation: dynamo's eager backend on "
                                            "a CPU (no kernels are generated)")
    return tags


def batch(step: int, micro: int, rank: int, world: int, seq_len: int, vocab: int, seed: int,
          device: Any) -> torch.Tensor:
    """Rank ``rank``'s micro batch ``micro`` of ``step``: rows of the global batch by rank."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + micro * world + rank)
    return torch.randint(0, vocab, (1, seq_len + 1), generator=g).to(device)


def loss_of(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, in float32 at least (float64 stays float64: the tests compare
    world sizes there); in chunks inside the model's forward where it has ``loss_chunk_tokens``
    (its softmax in float32)."""
    if getattr(model, "loss_chunk_tokens", None) is not None:
        return model(tokens[:, :-1], targets=tokens[:, 1:])
    logits = model(tokens[:, :-1])
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def shard(model: Llama, mode: str, cuda: bool, reshard_after_forward: bool = True) -> None:
    """FSDP2 over the default process group, each decoder layer its own unit.
    ``reshard_after_forward`` false: each layer keeps its gathered (one GPU: copied from host)
    parameters from its forward to its backward (ZeRO-2's memory, ZeRO-Offload's one copy of
    the weights per step instead of two)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    kw: dict[str, Any] = {}
    if mode == "fsdp2-cpu-offload":
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=cuda)  # pinning needs a GPU
    for layer in model.layers:
        fully_shard(layer, reshard_after_forward=reshard_after_forward, **kw)
    fully_shard(model, **kw)


def prefetch_h2d(model: Llama, plan: Plan, world: int,
                 device: Any) -> tuple[h2d_prefetch.NextLayerPrefetch | None, str]:
    """The next layer's host shards copied on a side stream (``h2d_prefetch``) where FSDP2
    would copy them on the compute stream: CPU offload at world size 1. Returns the
    installed prefetcher (None where not used) and what the record says about it."""
    if plan.mode != "fsdp2-cpu-offload":
        return None, f"not used: {plan.mode} keeps no parameters in host memory"
    if world > 1:
        return None, (f"not used: at world size {world} FSDP2's all-gather streams carry the "
                      f"host-to-device copies beside the compute")
    if not plan.h2d_prefetch:
        return None, "off (h2d_prefetch: false): FSDP2 copies each layer on the compute stream"
    return h2d_prefetch.NextLayerPrefetch(model, list(model.layers), device).install(
        backward=plan.reshard_after_forward), ""


def make_optimizer(model: nn.Module, mode: str, lr: float, weight_decay: float,
                   device: Any = "cpu", threads: int | None = None,
                   delayed: bool = False) -> Any:
    """AdamW, fused on both sides: torchao fuses its CPU AdamW by default, so FSDP2's CPU step
    (parameters in host memory under CPUOffloadPolicy) must be fused too for a fair pair; the
    unfused (foreach) step also makes whole-model temporaries a 125 GiB host cannot spare.
    FSDP2 offload: one fused AdamW per FSDP unit (``cpu_adamw``), which may step during
    backward (on ``threads``: None, torch's pool), with the step before's gradients where
    ``delayed`` (ZeRO-Offload's delayed update)."""
    if mode == "fsdp2-cpu-offload":
        return cpu_adamw.LayerwiseAdamW(cpu_adamw.fsdp_units(model), lr, weight_decay, device,
                                        threads=threads, delayed=delayed, model=model)
    if delayed:
        raise ValueError(f"the delayed update is FSDP2 offload's (fsdp2-cpu-offload), not {mode}'s")
    if mode == "torchao-cpu-offload":
        from torchao.optim import CPUOffloadOptimizer

        return CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, lr=lr,
                                   weight_decay=weight_decay, fused=True)
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, fused=True)


def accumulate(model: nn.Module, step: int, accum: int, rank: int, world: int, seq_len: int,
               micro_batch: int, vocab: int, seed: int, device: Any,
               before_last_backward: Callable[[], None] | None = None) -> torch.Tensor:
    """Forward and backward of this rank's ``accum`` micro batches of ``step`` (gradients
    accumulated); returns their mean loss (a device tensor: no sync). ``before_last_backward``
    runs right before the last micro batch's backward (the layer-wise optimizer starts)."""
    total = torch.zeros((), device=device)
    for m in range(accum):
        rows = [batch(step, m * micro_batch + i, rank, world, seq_len, vocab, seed, device)
                for i in range(micro_batch)]
        loss = loss_of(model, torch.cat(rows)) / accum
        if m == accum - 1 and before_last_backward is not None:
            before_last_backward()
        loss.backward()
        total += loss.detach()
    return total


def train_step(model: nn.Module, opt: Any, step: int, accum: int, rank: int, world: int,
               seq_len: int, micro_batch: int, vocab: int, seed: int, device: Any,
               overlap: bool = False) -> tuple[float, float, float]:
    """One optimizer step over ``accum`` micro batches of ``micro_batch`` rows on each rank;
    returns (the global batch's mean loss, seconds of the optimizer's own work, seconds of it
    the step waited for after backward: the exposed part). ``overlap`` (a ``LayerwiseAdamW``):
    each unit steps during backward as its gradients land in host memory."""
    begin = opt.begin if overlap else None
    total = accumulate(model, step, accum, rank, world, seq_len, micro_batch, vocab, seed, device,
                       before_last_backward=begin)
    _sync(device)  # the optimizer step is timed alone, not with backward's tail on the GPU
    t0 = time.perf_counter()
    if overlap:
        opt.finish()
    else:
        opt.step()
    _sync(device)
    exposed_s = time.perf_counter() - t0
    opt_s = getattr(opt, "busy_s", exposed_s)  # the layer-wise optimizer times its own steps
    opt.zero_grad(set_to_none=True)
    if world > 1:
        dist.all_reduce(total)
        total /= world
    return float(total), opt_s, exposed_s


def diagnose(plan: Plan, recorder: Recording, cuda: bool, model: nn.Module, opt: Any,
             device: Any, rank: int, world: int, accum: int, overlap: bool) -> None:
    """One more step after the measured ones, profiled (``step_profile``): its ``diag_*``
    figures in the record (rank 0's are the run's), or the tag ``finetune.step_profile`` saying
    why there are none. Every rank runs the step, so that their collectives pair."""
    if not cuda:
        recorder.set_tag("finetune.step_profile", "skipped: the figures are the GPU's (no CUDA)")
        return
    after = plan.warmup + plan.steps * max(1, plan.windows)  # the first step not measured
    (_, opt_s, exposed_s), figures, why = step_profile.profile_step(
        lambda: train_step(model, opt, after, accum, rank, world,
                           plan.seq_len, plan.micro_batch, plan.shape.vocab, plan.seed, device,
                           overlap),
        lambda: _sync(device))
    figures.update(diag_optimizer_s=opt_s, diag_optimizer_exposed_s=exposed_s)
    recorder.set_tag("finetune.step_profile", why or (
        f"step {after} (after the measured ones), torch.profiler CUDA "
        f"activity, reduced to diag_* (step_profile.py)"))
    recorder.log_metrics({k: v for k, v in figures.items() if math.isfinite(v)})


def measure_compute(model: nn.Module, plan: Plan, device: Any, accum: int) -> float:
    """Seconds of forward and backward of one optimizer step's micro batches with every
    weight on ``device`` and no optimizer: the GPU-compute part of an offloading step's floor.

    One untimed pass first (kernels, allocator), then one timed; gradients are dropped, the
    weights are not touched, so the run that follows trains the same model.
    """
    seconds = 0.0
    for timed in (False, True):
        _sync(device)
        t0 = time.perf_counter()
        accumulate(model, 0, accum, 0, 1, plan.seq_len, plan.micro_batch, plan.shape.vocab,
                   plan.seed, device)
        _sync(device)
        seconds = time.perf_counter() - t0 if timed else 0.0
        model.zero_grad(set_to_none=True)
    return seconds


def _sync(device: Any) -> None:
    if _is_cuda(device):
        torch.cuda.synchronize(device)


def run(plan: Plan, recorder: Recording, cuda: bool, pinned_gbps: tuple[float, float] | None) -> None:
    """Train ``plan`` on this rank, log steps and the run's figures (rank 0's are the run's).

    ``expandable_segments``: the caching allocator's segments grow in place for the run, so
    what the layers free and take each step does not strand reserved memory (the one-GPU 13B
    row's allocator reached its reserve's top and retried 8-15 times a run, 2026-11-28)."""
    with caching_allocator.expandable_segments(plan.expandable_segments and cuda) as grown:
        if plan.expandable_segments:
            recorder.set_tag("finetune.expandable_segments",
                             "true" if grown else "not applied: no CUDA device")
        _train(plan, recorder, cuda, pinned_gbps)


def _refuse(plan: Plan, world: int, cuda: bool) -> None:
    """What this plan cannot be on this job: a batch the ranks do not divide, a one-GPU peer
    over several tasks, torchao's offload without a GPU (a skip)."""
    if plan.global_batch % (plan.micro_batch * world):
        raise ValueError(f"global_batch {plan.global_batch} is not a multiple of micro_batch "
                         f"{plan.micro_batch} x world size {world}")
    if not plan.mode.startswith("fsdp2") and world > 1:
        raise ValueError(f"{plan.mode} is a one-GPU peer: run it with one task")
    if plan.mode == "torchao-cpu-offload" and not cuda:
        raise SkipRun("torchao's CPUOffloadOptimizer moves optimizer states between a GPU and "
                      "host memory: it needs a CUDA device")


def _build(plan: Plan, recorder: Recording, device: Any, cuda: bool) -> tuple[Llama, list[Any]]:
    """This rank's model, its build timed and its loss's chunks said."""
    t0 = time.perf_counter()
    build_parts: dict[str, float] = {}
    model, pinned = build_sharded(plan.shape, plan.dtype, plan.mode, plan.seed, device, cuda,
                                  plan.checkpointing,
                                  reshard_after_forward=plan.reshard_after_forward,
                                  timings=build_parts)
    _sync(device)
    recorder.log_metrics(build_s=time.perf_counter() - t0, **build_parts)
    model.loss_chunk_tokens = plan.loss_chunk_tokens
    recorder.set_tag("finetune.loss_chunk_tokens", "none" if plan.loss_chunk_tokens is None
                     else str(plan.loss_chunk_tokens))
    return model, pinned


def _keep_mlp_up(plan: Plan, model: Llama, recorder: Recording, cuda: bool, device: Any,
                 world: int) -> tuple[Plan, Callable[[int], None] | None]:
    """The layers that keep their MLP's up-projection: as asked, or fitted on a GPU in two more
    warm-up steps (``MlpUpFitting``, whose step hook is returned with the plan that has them)."""
    fitting = plan.mlp_up_fit and plan.checkpointing and plan.mlp_up_saved_layers > 0
    saved = keep_mlp_up(model, 0 if fitting and cuda else plan.mlp_up_saved_layers)
    if plan.mlp_up_saved_layers and not fitting:
        recorder.log_metric("mlp_up_saved_layers", float(saved))
        recorder.set_tag("finetune.mlp_up_saved", (
            f"the last {saved} of {len(model.layers)} decoder layers keep their MLP's "
            f"up-projection (not recomputed in backward)") if saved else
            "none: the model does not recompute (checkpointing off)")
    if not fitting:
        return plan, None
    plan = replace(plan, warmup=plan.warmup + 2)
    return plan, MlpUpFitting(model, plan, recorder, cuda, device, world).after_step


def _train(plan: Plan, recorder: Recording, cuda: bool,
           pinned_gbps: tuple[float, float] | None) -> None:
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    _refuse(plan, world, cuda)
    accum = plan.global_batch // (plan.micro_batch * world)
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    own_group = plan.mode.startswith("fsdp2") and not dist.is_initialized()
    if own_group:  # FSDP2 at world size 1 still shards through a process group (of one)
        dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1)
    try:
        if cuda and plan.mode != "fsdp2":
            check_host_memory(plan, world, recorder, device)
        model, pinned = _build(plan, recorder, device, cuda)
        plan, sizing = _keep_mlp_up(plan, model, recorder, cuda, device, world)
        for key, value in compile_model(model, plan, cuda).items():
            recorder.set_tag(key, value)
        if plan.mode.startswith("fsdp2"):
            recorder.set_tag("finetune.reshard_after_forward",
                             str(plan.reshard_after_forward).lower())
        prefetch, why = prefetch_h2d(model, plan, world, device)
        _run(plan, recorder, cuda, pinned_gbps, model, device, rank, world, accum,
             after_warmup_step=sizing)
        if prefetch is not None:
            prefetch.remove()
            why = prefetch.counts.describe()
            recorder.log_metrics(h2d_prefetch_read=float(prefetch.counts.read),
                                 h2d_prefetch_dropped=float(prefetch.counts.dropped))
        recorder.set_tag("finetune.h2d_prefetch", why)
        if pinned:  # after the steps: FSDP2 may re-pin a shard at its lazy init
            recorder.log_metrics(pinned_exact_gb=sum(b.numel() for b in pinned) / 1e9,
                                 params_in_exact_pinned=shard_init.share_in(model, pinned))
    finally:
        if own_group:
            dist.destroy_process_group()


def probe_compute(plan: Plan, device: Any, accum: int, saved: int) -> float:
    """The run's GPU compute alone (a diagnostic beside the floor): forward and backward of this
    rank's micro batches of one step on a model whole on ``device`` (``measure_compute``), with
    up to 4 decoder layers so that it fits beside the run; more layers are extrapolated from
    probes of 2 and 4, and where the run's last layers keep their MLP's up-projection
    (``keep_mlp_up``: ``saved`` of them) a third probe of 2 such layers prices them."""
    layers = plan.shape.layers
    saved = min(saved, layers) if plan.checkpointing else 0

    def timed(n: int, keep: int) -> float:
        probe = build_model(replace(plan.shape, layers=n), plan.dtype, device, plan.seed,
                            plan.checkpointing)
        keep_mlp_up(probe, keep)
        probe.loss_chunk_tokens = plan.loss_chunk_tokens
        compile_model(probe, plan, _is_cuda(device))
        seconds = measure_compute(probe, plan, device, accum)
        del probe
        if _is_cuda(device):
            torch.cuda.empty_cache()
        return seconds

    if layers <= 4:
        return timed(layers, saved)
    t2, t4 = timed(2, 0), timed(4, 0)
    plain = step_floor.extrapolate_layers(t2, t4, 2, 4, layers)
    if not saved:
        return plain
    return plain + saved * ((timed(2, 2) - t2) / 2)  # each saving layer's difference


@dataclass
class Measured:
    """What the measured steps of a run gave (``_measured_steps``): each step's seconds, its
    optimizer's and the part of it the step waited for, the losses of every step, and the
    warm-up's seconds."""

    times: list[float]
    opt_times: list[float]
    exposed_times: list[float]
    losses: list[float]
    warmup_s: float


def _measured_steps(plan: Plan, recorder: Recording, model: Llama, opt: Any, device: Any,
                    rank: int, world: int, accum: int, overlap: bool,
                    after_warmup_step: Callable[[int], None] | None) -> Measured:
    """The warm-up steps, then ``plan.windows`` windows of ``plan.steps`` steps inside one
    measured region, each step logged (its window said on its line)."""
    out = Measured([], [], [], [], 0.0)
    windows = max(1, plan.windows)  # repeats: windows of plan.steps, one measured region
    recorder.mark_setup_done()  # set-up ends where the first step begins (setup_s)
    with ExitStack() as measured:  # the measured window: the steps after warm-up
        for step in range(plan.warmup + plan.steps * windows):
            if step == plan.warmup:
                measured.enter_context(measured_region())
            if step >= plan.warmup and windows > 1:  # step lines say their window
                recorder.repeat = (step - plan.warmup) // plan.steps
            _sync(device)
            t0 = time.perf_counter()
            loss, opt_s, exposed_s = train_step(model, opt, step, accum, rank, world,
                                                plan.seq_len, plan.micro_batch,
                                                plan.shape.vocab, plan.seed, device, overlap)
            dt = time.perf_counter() - t0
            recorder.log_step(step, loss=loss, step_s=dt, optimizer_s=opt_s,
                              optimizer_exposed_s=exposed_s)
            out.losses.append(loss)
            if step < plan.warmup:  # first kernels, allocator, pinned blocks, compilation
                out.warmup_s += dt
                if after_warmup_step is not None:  # MlpUpFitting
                    after_warmup_step(step)
            else:
                out.times.append(dt)
                out.opt_times.append(opt_s)
                out.exposed_times.append(exposed_s)
    recorder.repeat = None
    return out


def _run(plan: Plan, recorder: Recording, cuda: bool, pinned_gbps: tuple[float, float] | None,
         model: Llama, device: Any, rank: int, world: int, accum: int,
         after_warmup_step: Callable[[int], None] | None = None) -> None:
    n_params = sum(p.numel() for p in model.parameters())  # global sizes, sharded or not
    threads = plan.cpus or torch.get_num_threads()
    torch.set_num_threads(threads)  # the job's CPUs, whatever a launcher left in the pool
    overlap = plan.overlap_optimizer and accum == 1 and plan.mode == "fsdp2-cpu-offload"
    # stepping during backward, the optimizer leaves 2 of the rank's CPUs to the training
    # thread's kernel launches and the driver's and NCCL's threads (cpu_adamw.optimizer_threads)
    opt_threads = cpu_adamw.optimizer_threads(threads, overlap)
    opt = make_optimizer(model, plan.mode, plan.lr, plan.weight_decay, device, opt_threads,
                         plan.delayed_update)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    got = _measured_steps(plan, recorder, model, opt, device, rank, world, accum, overlap,
                          after_warmup_step)
    if plan.compile:  # dynamo's graphs so far: the run's layers share one (the probe's plain
        # layers, measured later, add their own)
        from torch._dynamo.utils import counters

        recorder.log_metric("compile_graphs", float(counters["stats"]["unique_graphs"]))
    if plan.diagnose_step:
        diagnose(plan, recorder, cuda, model, opt, device, rank, world, accum, overlap)
    if hasattr(opt, "wait_kind"):
        recorder.set_tag("finetune.optimizer_wait", opt.wait_kind)
    windows = max(1, plan.windows)
    cut = [slice(w * plan.steps, (w + 1) * plan.steps) for w in range(windows)]
    p50s = slowest_p50s(got.times, cut, world, device)
    tokens = plan.global_batch * plan.seq_len
    elt = torch.finfo(plan.dtype).bits // 8
    losses = got.losses
    figures = {"optimizer_overlapped": float(overlap), "torch_threads": float(threads),
               "optimizer_delayed": float(plan.delayed_update),
               "optimizer_threads": float(opt_threads), "warmup_s": got.warmup_s,
               "loss_first": losses[0], "loss_last": losses[-1], "loss_drop": losses[0] - losses[-1],
               "params_b": n_params / 1e9, "accumulation_steps": float(accum),
               "peak_host_mem_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}
    if cuda:
        figures.update(gpu_memory_figures(device))
    pinned = pinned_host_gb() if cuda else None
    if pinned is not None:
        figures["pinned_host_peak_gb"] = pinned
    figures["flops_per_token"] = model_flops_per_token(model, plan)
    figures["matmul_tflops"] = matmul_rate_tflops(device, plan.dtype)
    kept = sum(1 for layer in model.layers if layer.save_mlp_up)
    figures["compute_measured_s"] = probe_compute(plan, device, accum, kept)  # diagnostic
    floor = floor_of(plan, model, figures, n_params, elt, world, threads, overlap, cuda,
                   pinned_gbps)
    # the step's figures over every measured step, as each window's below
    figures.update(**floor, **step_figures(p50s[0], tokens, got.times, got.opt_times,
                                           got.exposed_times, floor))
    if floor.get("floor_compute_s", 0) > 0:
        figures["compute_measured_over_floor"] = (figures["compute_measured_s"]
                                                  / floor["floor_compute_s"])
    recorder.log_metrics(finite(figures))
    if windows > 1:  # one sample per window, judged like the run (repeats.measure aggregates)
        for c, s_w in zip(cut, p50s[1:]):
            recorder.add_sample(finite(step_figures(s_w, tokens, got.times[c], got.opt_times[c],
                                                     got.exposed_times[c], floor)))
