"""The GPU-GPU link as distributed runs see it: time of one collective over the current
process group, with nccl-tests' bandwidth definitions (NVIDIA/nccl-tests doc/PERFORMANCE.md).

``algbw = S / t``; ``busbw = algbw * factor`` with factor ``2(n-1)/n`` for all-reduce and
``(n-1)/n`` for all-gather, where ``S`` is the message (all-reduce: the buffer every rank
holds; all-gather: the whole gathered output, ``n`` per-rank pieces). GB = 1e9 bytes.

``t`` is the mean over ``iters`` back-to-back calls, after ``warmup`` untimed ones and one
aligning call, then the largest over ranks (every rank gets the same figure, so a floor
computed from it is the same on every rank). NCCL (CUDA tensors, bf16) is timed with CUDA
events on the current stream; gloo (CPU tensors, float32) by the host clock. Like
``link.py`` for the host link, a run measures it itself, so that a floor and the figure it
judges come from the same node and moment. Needs ``torch.distributed`` initialised.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from hopperlab.core.stats import GB

OPS = ("all_reduce", "all_gather")


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' correction from algorithm to bus bandwidth for ``op`` over ``world_size``."""
    n = int(world_size)
    if n < 1:
        raise ValueError(f"world_size: expected at least 1, got {world_size!r}")
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op == "all_gather":
        return (n - 1) / n
    raise ValueError(f"op: expected one of {', '.join(OPS)}, got {op!r}")


def bandwidths(op: str, nbytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s of one ``op`` of ``nbytes`` that took ``seconds``."""
    if seconds <= 0 or not math.isfinite(seconds):
        return float("nan"), float("nan")
    alg = nbytes / seconds / GB
    return alg, alg * bus_factor(op, world_size)


@dataclass(frozen=True)
class CollectiveTiming:
    """One collective of one size, timed over the group."""

    op: str
    #: S of nccl-tests: the bytes of the message (rounded up to whole elements and ranks)
    nbytes: int
    world_size: int
    backend: str
    #: seconds per call: the mean over the timed calls, the slowest rank's
    seconds: float
    iters: int
    #: whether the timed calls were replayed from one captured CUDA graph (no launch overhead)
    graph: bool = False

    @property
    def algbw_gbps(self) -> float:
        return bandwidths(self.op, self.nbytes, self.seconds, self.world_size)[0]

    @property
    def busbw_gbps(self) -> float:
        return bandwidths(self.op, self.nbytes, self.seconds, self.world_size)[1]


def _buffers(torch: Any, op: str, nbytes: int, n: int, on_cuda: bool) -> tuple[Any, Any, int]:
    """(input, output, S in bytes): all-reduce in place; all-gather of n equal pieces."""
    dtype = torch.bfloat16 if on_cuda else torch.float32
    device = torch.device("cuda", torch.cuda.current_device()) if on_cuda else torch.device("cpu")
    size = torch.tensor([], dtype=dtype).element_size()
    if op == "all_reduce":
        count = max(1, math.ceil(nbytes / size))
        x = torch.zeros(count, dtype=dtype, device=device)
        return x, x, count * size
    per_rank = max(1, math.ceil(nbytes / (size * n)))
    x = torch.zeros(per_rank, dtype=dtype, device=device)
    out = torch.empty(per_rank * n, dtype=dtype, device=device)
    return x, out, per_rank * n * size


def _caller(dist: Any, op: str, x: Any, out: Any, group: Any) -> Any:
    if op == "all_reduce":
        return lambda: dist.all_reduce(x, group=group)
    gather = getattr(dist, "all_gather_into_tensor", None)
    if gather is not None:
        return lambda: gather(out, x, group=group)
    pieces = list(out.chunk(dist.get_world_size(group)))
    return lambda: dist.all_gather(pieces, x, group=group)


def time_collective(op: str, nbytes: int, iters: int = 20, *, warmup: int = 5,
                    group: Any = None, graph: bool = False) -> CollectiveTiming:
    """Time ``iters`` back-to-back ``op`` calls of ``nbytes`` over ``group`` (default: world).

    ``graph``: capture the timed calls in one CUDA graph and time its replay (NCCL only), the
    cost a graph-captured step pays; eager calls also pay Python's launch of each call.
    """
    if op not in OPS:
        raise ValueError(f"op: expected one of {', '.join(OPS)}, got {op!r}")
    if iters < 1 or warmup < 0:
        raise ValueError(f"iters >= 1 and warmup >= 0 expected, got {iters}, {warmup}")
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("time_collective needs torch.distributed initialised (the run's "
                           "process group)")
    backend = str(dist.get_backend(group))
    on_cuda = "nccl" in backend  # "nccl", or "cpu:gloo,cuda:nccl" for a group of both
    if graph and not on_cuda:
        raise ValueError(f"graph=True needs NCCL on CUDA; the group's backend is {backend}")
    n = dist.get_world_size(group)
    x, out, s_bytes = _buffers(torch, op, nbytes, n, on_cuda)
    call = _caller(dist, op, x, out, group)
    if graph:
        seconds = _graph_seconds(torch, call, iters, warmup)
    elif on_cuda:
        seconds = _event_seconds(torch, call, iters, warmup)
    else:
        seconds = _host_seconds(call, iters, warmup)
    worst = torch.tensor([seconds], dtype=torch.float64, device=x.device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return CollectiveTiming(op=op, nbytes=s_bytes, world_size=n, backend=backend,
                            seconds=float(worst.item()), iters=iters, graph=graph)


def _host_seconds(call: Any, iters: int, warmup: int) -> float:
    for _ in range(warmup + 1):  # the last untimed call lines the ranks up
        call()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t0) / iters


def _event_seconds(torch: Any, call: Any, iters: int, warmup: int) -> float:
    for _ in range(warmup + 1):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    call()  # ranks leave this one together: the timed calls wait for no late peer
    start.record()
    for _ in range(iters):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def _graph_seconds(torch: Any, call: Any, iters: int, warmup: int) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # eager warm-up on a side stream, as capture requires
        for _ in range(warmup + 1):
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            call()
    g.replay()  # untimed replay: lines the ranks up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def collective_latency(nbytes: int, iters: int = 20, *, group: Any = None,
                       graph: bool = False) -> float:
    """Seconds of one all-reduce of ``nbytes`` over ``group`` (default: the run's world), the
    slowest rank's mean over ``iters`` back-to-back calls: a TP serving floor's all-reduce term.

    Call it on every rank (it is a collective) after the process group is up, e.g. at the start
    of a serving run: ``collective_latency(8192 * 2 * batch, 50)`` for a 70B decode step's
    hidden-size message. ``graph=True`` (NCCL only) times a CUDA-graph replay of the calls.
    """
    return time_collective("all_reduce", nbytes, iters, group=group, graph=graph).seconds


def check_collective(op: str, nbytes: int, *, group: Any = None) -> bool:
    """Whether ``op`` of ``nbytes`` gives the right answer on this rank (nccl-tests checks
    every result too: a call that moved nothing would look fast). Rank r sends r + 1."""
    import torch
    import torch.distributed as dist

    n, rank = dist.get_world_size(group), dist.get_rank(group)
    on_cuda = "nccl" in str(dist.get_backend(group))
    x, out, _ = _buffers(torch, op, nbytes, n, on_cuda)
    x.fill_(rank + 1)
    _caller(dist, op, x, out, group)()
    if op == "all_reduce":
        return bool((out == n * (n + 1) / 2).all())
    want = torch.arange(1, n + 1, dtype=out.dtype, device=out.device).repeat_interleave(x.numel())
    return bool(torch.equal(out, want))
