"""What the node and the model allow a sharded step: the matmul rate, the host memory's triad
with every rank streaming, the FLOPs of a step, the pinned host memory held; and the step's
figures against its floor (``step_floor``). Split from ``engine`` (the model, its sharding and
its steps): these measure, they train nothing."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hopperlab.core.stats import percentile
from hopperlab.cuda.device_rates import matmul_tflops
from hopperlab.node.host_bandwidth import triad_gbps
from hopperlab.workloads.finetune.sharded import step_floor
from hopperlab.workloads.finetune.sharded.llama import Llama
from hopperlab.workloads.finetune.sharded.plan import Plan


def is_cuda(device: Any) -> bool:
    """Whether ``device`` (a torch.device or its name) is a GPU's."""
    return getattr(device, "type", str(device)) == "cuda"


def pinned_host_gb() -> float | None:
    """Pinned host memory PyTorch's caching host allocator holds, GB (None where it cannot
    say). It rounds every block up to a power of two: for the 13B shape's weight matrices
    that is 1.3-1.9x their bytes, which is what sizes the host memory an offload run needs."""
    try:
        stats = torch.cuda.host_memory_stats()
    except (RuntimeError, AttributeError):
        return None
    # the key names moved between releases ("reserved_bytes.all.peak", "allocated_bytes.peak")
    for kind in ("reserved_bytes", "allocated_bytes"):
        for key, value in stats.items():
            if key.startswith(kind) and key.endswith(".peak") and value:
                return value / 1e9
    return None


@dataclass(frozen=True)
class NodeTriad:
    """The host memory rate with every rank of the node streaming at once."""

    #: GB/s of all the ranks together (the rate their optimizer steps share) and of this one
    node_gbps: float
    rank_gbps: float
    threads: int
    ranks: int
    #: wall-clock (start, end) of this rank's timed passes
    windows: list[tuple[float, float]]


def node_triad(share_bytes: int, threads: int, ranks_on_host: int) -> NodeTriad:
    """The triad on ``threads`` threads in every rank of the node at once: each timed pass
    starts at a barrier and counts at the slowest rank's time, so the node's rate is the sum
    of what the ranks streamed over the time they all streamed. Arrays a quarter of the
    rank's parameter bytes, 8 to 512 MiB each (well past the caches)."""
    together = dist.is_initialized() and dist.get_world_size() > 1

    def slowest(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=_cpu_group())
        return float(t)

    windows: list[tuple[float, float]] = []
    mib = max(8, min(512, share_bytes // 4 // 2**20))
    rank_gbps = triad_gbps(mib_per_array=mib, threads=threads, windows=windows,
                           start=(lambda: dist.barrier(group=_cpu_group())) if together else None,
                           slowest=slowest if together else None)
    return NodeTriad(node_gbps=rank_gbps * ranks_on_host, rank_gbps=rank_gbps, threads=threads,
                     ranks=ranks_on_host, windows=windows)


_CPU_GROUP: list[Any] = []


def _cpu_group() -> Any:
    """A gloo group over the default group's ranks (CPU tensors under NCCL), made once."""
    if not _CPU_GROUP:
        backend = dist.get_backend()
        _CPU_GROUP.append(None if backend == "gloo" else dist.new_group(backend="gloo"))
    return _CPU_GROUP[0]


def ranks_on_host(world: int) -> int:
    """Ranks of this job on this host, asked of the ranks themselves (each names its host over
    the CPU group), so that no launcher's variables are read here (backends/ owns those)."""
    import socket

    if world <= 1 or not dist.is_initialized():
        return max(1, world)
    names: list[Any] = [None] * world
    dist.all_gather_object(names, socket.gethostname(), group=_cpu_group())
    return sum(1 for n in names if n == socket.gethostname())


def matmul_rate_tflops(device: Any, dtype: Any) -> float:
    """The dense matmul rate the compute floor divides by: the GPU's (``device_rates``, bf16
    at 8192 cubed) or, on a CPU-only run, the CPU's in ``dtype`` on the job's threads."""
    if is_cuda(device):
        return matmul_tflops(device, dtype=dtype if dtype in (torch.bfloat16, torch.float16)
                             else torch.bfloat16)
    n = 512
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.matmul(a, b)
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e12


def matmul_params(model: Llama) -> int:
    """Parameters of the model's matrix products (global sizes, sharded or not): every 2-D
    weight but the embedding, which is a lookup."""
    return sum(p.numel() for name, p in model.named_parameters()
               if p.dim() == 2 and not name.startswith("embed"))


def step_flops_of(model: Llama, plan: Plan, world: int) -> float:
    """FLOPs of this rank's step (``step_floor.step_flops``; global parameter sizes)."""
    head = model.head.weight.numel()
    tokens = plan.global_batch // world * plan.seq_len
    not_recomputed = sum(layer.gate_up.weight.numel() for layer in model.layers
                         if plan.checkpointing and layer.save_mlp_up)
    return step_floor.step_flops(matmul_params(model), head, plan.shape.layers,
                                 plan.shape.hidden, plan.seq_len, tokens, plan.checkpointing,
                                 not_recomputed)


def model_flops_per_token(model: Llama, plan: Plan) -> float:
    """The model's FLOPs per training token (forward and backward, causal attention; no
    recomputation): the figure the torch backend logs as ``flops_per_token``, so that the
    energy's plausibility gate (work per joule against the node's matmul probe) judges these
    runs too."""
    return step_floor.step_flops(matmul_params(model), model.head.weight.numel(),
                                 plan.shape.layers,
                                 plan.shape.hidden, plan.seq_len, 1, checkpointing=False)


def step_figures(s_iter: float, tokens: int, times: list[float], opt_times: list[float],
                 exposed_times: list[float], floor: dict[str, float]) -> dict[str, float]:
    """The step's figures over ``times`` (the run's measured steps, or one window's: its
    sample): the p50 step (``s_iter``: the slowest rank's), the figures judged from it and its
    floor ratios, this rank's own parts, and the tokens of its steps (``measured_tokens``, the
    work done inside the energy window; the windows' samples sum to the run's,
    ``work_done_totals``)."""
    out = {"step_time_p50_s": s_iter, "s_per_iter": s_iter, "tokens_per_s": tokens / s_iter,
           "step_s": percentile(times, 50), "optimizer_step_s": percentile(opt_times, 50),
           "optimizer_exposed_s": percentile(exposed_times, 50),
           "measured_tokens": float(len(times) * tokens), **step_floor.over_floor(s_iter, floor)}
    if floor.get("optimizer_floor_s", 0) > 0:
        out["optimizer_over_floor"] = out["optimizer_step_s"] / floor["optimizer_floor_s"]
    return out


def slowest_p50s(times: list[float], cut: list[slice], world: int, device: Any) -> list[float]:
    """The run's p50 step and each window's, the slowest rank's: the run is as fast as its
    slowest rank, window by window too; one collective for all of them, on every rank."""
    p50s = [percentile(times, 50)] + [percentile(times[c], 50) for c in cut]
    if world > 1:
        t = torch.tensor(p50s, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        p50s = [float(v) for v in t.tolist()]
    return p50s


def gpu_memory_figures(device: Any) -> dict[str, float]:
    """The GPU memory peaks, and the caching allocator's retries (each frees its cache and
    waits for the GPU: idle time near a full GPU, e.g. under mlp_up_fit)."""
    stats = torch.cuda.memory_stats(device)
    return {"peak_gpu_mem_gb": torch.cuda.max_memory_allocated(device) / 1e9,
            "peak_gpu_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            "gpu_alloc_retries": float(stats.get("num_alloc_retries", 0)),
            "peak_gpu_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30}


def floor_of(plan: Plan, model: Llama, figures: dict[str, float], n_params: int, elt: int,
           world: int, threads: int, overlap: bool, cuda: bool,
           pinned_gbps: tuple[float, float] | None) -> dict[str, float]:
    """The floor from the hardware (step_floor): FLOPs at the measured matmul rate, the link's
    bytes at the pinned rates, the CPU optimizer's bytes at the node's triad (every rank at
    once, on the job's threads); the triad's own figures go into ``figures``."""
    local = ranks_on_host(world)
    host = None
    if plan.mode in step_floor.OFFLOADED:
        triad = node_triad(n_params * elt // world, threads, local)
        host = triad.node_gbps
        figures.update(host_triad_gbps=host, host_triad_rank_gbps=triad.rank_gbps,
                       host_triad_threads=float(triad.threads), host_triad_ranks=float(local))
    rates = pinned_gbps if cuda and pinned_gbps else (None, None)
    return step_floor.step_floor(step_floor.FloorInputs(
        mode=plan.mode, params=n_params, elt_bytes=elt, world=world,
        flops=step_flops_of(model, plan, world), matmul_tflops=figures["matmul_tflops"],
        host_gbps=host, ranks_on_host=local, h2d_gbps=rates[0], d2h_gbps=rates[1],
        overlapped=overlap, reshard_after_forward=plan.reshard_after_forward))


def finite(figures: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in figures.items() if math.isfinite(v)}
