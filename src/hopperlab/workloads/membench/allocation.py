"""The alloc test: what one allocation of each memory kind (device, pinned, host, managed) costs,
and how fast its pages are first touched or migrated.

Fresh allocations every sample, the median of ``repeats`` reported; managed memory stays under
the free-memory rule (the variant is skipped instead). Without a CUDA device only ``host`` runs.
What each figure times, kind by kind: docs/benchmarks/membench.md.
"""

from __future__ import annotations

import mmap
import time
from typing import Any, Callable

from hopperlab.core.rundir import SkipRun
from hopperlab.core.stats import GB, MIB, gbps
from hopperlab.cuda import runtime as cr
from hopperlab.cuda.managed_policy import managed_bytes_allowed
from hopperlab.cuda.system_memory import system_memory_support, system_memory_tags
from hopperlab.workloads.base import Recording
from hopperlab.workloads.membench import MembenchParams
from hopperlab.workloads.membench.common import Env, Plan, SweepRecord, log_finite

BYTE_A = 0x5A
BYTE_B = 0xA5


def check_alloc(env: Env, params: MembenchParams, memory: str) -> None:
    """Raise SkipRun where this node cannot run the variant (the family's check refused the
    contradictory ones when the matrix loaded)."""
    kind = params.kind
    if kind != "host" and env.target != "cuda":
        raise SkipRun(f"{kind} allocations need a CUDA device: {env.no_cuda_reason}")


def run_alloc(env: Env, params: MembenchParams, plan: Plan, recorder: Recording, *, memory: str,
              allow_oversubscription: bool, mark: Callable[[str], Any]) -> None:
    kind = params.kind
    recorder.set_tag("membench.kind", kind)
    check_alloc(env, params, memory)
    fn = {"device": _device, "pinned": _pinned, "managed": _managed, "host": _host,
          "system": _system}[kind]
    main = {"managed": "gpu_first_touch_gbps", "system": "gpu_read_gbps"}.get(
        kind, "first_touch_gbps")
    sweep = SweepRecord(recorder, kind, main=main)
    ctx = _Ctx(env, plan, recorder, allow_oversubscription)
    fn(ctx, sweep, mark, _prepare(ctx, kind))
    sweep.write()
    log_finite(recorder, "gbps_peak", sweep.peak(main))
    log_finite(recorder, "gbps_at_largest", sweep.largest(main))
    log_finite(recorder, "alloc_ms_at_largest", sweep.largest("alloc_ms"))
    log_finite(recorder, "free_ms_at_largest", sweep.largest("free_ms"))
    log_finite(recorder, "largest_size_mb", sweep.rows[-1]["size_mb"] if sweep.rows else float("nan"))
    extra = {"managed": ("cpu_first_touch_gbps", "migrate_h2d_gbps", "migrate_d2h_gbps",
                         "prefetch_h2d_gbps", "prefetch_d2h_gbps", "resident_read_gbps"),
             "system": SYSTEM_FIGURES}.get(kind, ("write_gbps",))
    for name in extra:
        log_finite(recorder, f"{name}_at_largest", sweep.largest(name))


class _Ctx:
    def __init__(self, env: Env, plan: Plan, recorder: Recording, allow_oversubscription: bool) -> None:
        self.env = env
        self.plan = plan
        self.recorder = recorder
        self.allow_oversubscription = allow_oversubscription
        self.torch = env.torch

    def samples(self) -> range:
        return range(self.plan.warmup + self.plan.repeats)

    def timed(self, i: int) -> bool:
        return i >= self.plan.warmup


def _prepare(ctx: _Ctx, kind: str) -> Any:
    """Per-kind setup before the sweep; may raise SkipRun."""
    if kind == "host":
        ctx.recorder.set_tag("membench.alloc_api", "mmap (anonymous, private)")
        ctx.recorder.set_tag("membench.thp", _thp())
        return None
    if kind == "device":
        ctx.recorder.set_tag("membench.alloc_api", "torch.empty(device=cuda) after empty_cache")
        return None
    if kind == "pinned":
        empty = _host_cache_emptier(ctx.torch)
        if empty is not None:
            ctx.recorder.set_tag("membench.alloc_api", "torch.empty(pin_memory=True)")
            return ("torch", empty)
        ctx.recorder.set_tag("membench.alloc_api", "cudaHostAlloc (ctypes; this torch cannot "
                             "empty its pinned-memory cache)")
        return ("ctypes", _runtime_or_skip("pinned allocations"))
    if kind == "system":
        return _prepare_system(ctx)
    # managed
    rt = _runtime_or_skip("managed memory")
    torch, dev = ctx.torch, ctx.env.device
    if not rt.device_attribute(cr.ATTR_MANAGED_MEMORY, dev):
        raise SkipRun(f"managed memory: device {dev} does not support cudaMallocManaged")
    concurrent = bool(rt.device_attribute(cr.ATTR_CONCURRENT_MANAGED_ACCESS, dev))
    pageable = bool(rt.device_attribute(cr.ATTR_PAGEABLE_MEMORY_ACCESS, dev))
    need = ctx.plan.largest_mb * MIB
    free, _total = torch.cuda.mem_get_info(dev)
    if not managed_bytes_allowed(need, free, ctx.env.is_grace_hopper, ctx.allow_oversubscription):
        raise SkipRun(f"managed memory: {need / GB:.2f} GB asked for, but at most half of the "
                      f"GPU's free memory ({free / GB:.2f} GB) may be managed on a node that is "
                      f"not Grace Hopper unless the site sets allow_oversubscription: true")
    ctx.recorder.set_tag("membench.alloc_api", "cudaMallocManaged (ctypes)")
    ctx.recorder.set_tag("membench.cudart", rt.path)
    ctx.recorder.set_tag("membench.cudart_version", rt.version)
    ctx.recorder.set_tag("membench.prefetch_api", rt.prefetch_api)
    ctx.recorder.set_tag("membench.concurrent_managed_access", str(concurrent).lower())
    ctx.recorder.set_tag("membench.pageable_memory_access", str(pageable).lower())
    return (rt, concurrent)


def _runtime_or_skip(what: str) -> Any:
    try:
        return cr.CudaRuntime()
    except (cr.CudaError, OSError, AttributeError) as exc:
        raise SkipRun(f"{what} need the CUDA runtime library: {exc}") from None


def _thp() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as fh:
            return fh.read().strip()
    except OSError:
        return "unknown"


def _host_cache_emptier(torch: Any) -> Callable[[], None] | None:
    for owner, name in ((getattr(torch, "accelerator", None), "empty_host_cache"),
                        (torch._C, "_host_emptyCache"),
                        (torch._C, "_accelerator_emptyHostCache")):
        fn = getattr(owner, name, None) if owner is not None else None
        if callable(fn):
            return fn
    return None


# --------------------------------------------------------------------------- kinds
def _events(torch: Any) -> tuple[Any, Any]:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _gpu_timed(torch: Any, fn: Callable[[], Any], stream: Any = None) -> float:
    """Seconds ``fn``'s GPU work takes on the current stream (CUDA events)."""
    start, end = _events(torch)
    start.record(stream)
    fn()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _cpu_timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _alloc_samples() -> dict[str, list[float]]:
    return {"alloc_ms": [], "first_touch_gbps": [], "write_gbps": [], "free_ms": []}


def _add_alloc_sample(s: dict[str, list[float]], n: int, t_alloc: float, t_first: float,
                      t_write: float, t_free: float) -> None:
    """One timed sample of an allocate / first write / second write / free cycle of n bytes."""
    s["alloc_ms"].append(t_alloc * 1e3)
    s["first_touch_gbps"].append(gbps(n, t_first))
    s["write_gbps"].append(gbps(n, t_write))
    s["free_ms"].append(t_free * 1e3)


def _device(ctx: _Ctx, sweep: SweepRecord, mark: Callable[[str], Any], _setup: Any) -> None:
    torch = ctx.torch
    dev = torch.device("cuda", ctx.env.device)
    for size_mb in ctx.plan.sizes_mb:
        n = size_mb * MIB
        s = _alloc_samples()
        with mark(f"device alloc {size_mb} MiB"):
            for i in ctx.samples():
                torch.cuda.synchronize(dev)
                torch.cuda.empty_cache()
                t0 = time.perf_counter()
                x = torch.empty(n, dtype=torch.uint8, device=dev)
                t_alloc = time.perf_counter() - t0
                t_first = _gpu_timed(torch, lambda: x.fill_(BYTE_A))
                t_write = _gpu_timed(torch, lambda: x.fill_(BYTE_B))
                _check_gpu(x, BYTE_B, f"device {size_mb} MiB")
                x = None  # release the buffer now (a name, not a del: the lambdas above read it)
                torch.cuda.synchronize(dev)
                t_free = _cpu_timed(torch.cuda.empty_cache)
                if ctx.timed(i):
                    _add_alloc_sample(s, n, t_alloc, t_first, t_write, t_free)
        sweep.add(size_mb, s)


def _pinned(ctx: _Ctx, sweep: SweepRecord, mark: Callable[[str], Any], setup: Any) -> None:
    torch = ctx.torch
    host = ctx.env.host
    how, tool = setup
    for size_mb in ctx.plan.sizes_mb:
        n = size_mb * MIB
        s = _alloc_samples()
        with mark(f"pinned alloc {size_mb} MiB"):
            for i in ctx.samples():
                if how == "torch":
                    tool()
                    t0 = time.perf_counter()
                    x = torch.empty(n, dtype=torch.uint8, pin_memory=True)
                    t_alloc = time.perf_counter() - t0
                    ptr = None
                    a = x.numpy()
                else:
                    t0 = time.perf_counter()
                    ptr = tool.host_alloc(n)
                    t_alloc = time.perf_counter() - t0
                    x = a = cr.host_view(ptr, n)
                try:
                    t_first = _cpu_timed(lambda: host.fill(a, BYTE_A))
                    t_write = _cpu_timed(lambda: host.fill(a, BYTE_B))
                    if not host.all_equal(a, BYTE_B):
                        raise RuntimeError(f"pinned {size_mb} MiB: write did not land")
                finally:
                    x = a = None
                    if ptr is not None:
                        t_free = _cpu_timed(lambda: tool.free_host(ptr))
                if how == "torch":
                    t_free = _cpu_timed(tool)
                if ctx.timed(i):
                    _add_alloc_sample(s, n, t_alloc, t_first, t_write, t_free)
        sweep.add(size_mb, s)


def _host(ctx: _Ctx, sweep: SweepRecord, mark: Callable[[str], Any], _setup: Any) -> None:
    host = ctx.env.host
    for size_mb in ctx.plan.sizes_mb:
        n = size_mb * MIB
        s = _alloc_samples()
        with mark(f"host alloc {size_mb} MiB"):
            for i in ctx.samples():
                t0 = time.perf_counter()
                mm = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                t_alloc = time.perf_counter() - t0
                a = None
                try:
                    a = host.view(mm)
                    t_first = _cpu_timed(lambda: host.fill(a, BYTE_A))
                    t_write = _cpu_timed(lambda: host.fill(a, BYTE_B))
                    if not host.all_equal(a, BYTE_B):
                        raise RuntimeError(f"host {size_mb} MiB: write did not land")
                finally:
                    a = None  # drop the view: an mmap with exported buffers cannot close
                    t_free = _cpu_timed(mm.close)
                if ctx.timed(i):
                    _add_alloc_sample(s, n, t_alloc, t_first, t_write, t_free)
        sweep.add(size_mb, s)


def _managed(ctx: _Ctx, sweep: SweepRecord, mark: Callable[[str], Any], setup: Any) -> None:
    rt, concurrent = setup
    torch = ctx.torch
    host = ctx.env.host
    dev_index = ctx.env.device
    dev = torch.device("cuda", dev_index)
    stream = torch.cuda.Stream(dev)
    names = ["alloc_ms", "gpu_first_touch_gbps", "prefetch_d2h_gbps", "prefetch_h2d_gbps",
             "resident_read_gbps", "free_ms", "cpu_first_touch_gbps", "migrate_h2d_gbps",
             "migrate_d2h_gbps"]
    for size_mb in ctx.plan.sizes_mb:
        n = size_mb * MIB
        s: dict[str, list[float]] = {k: [] for k in names}
        scratch = host.empty(n)  # the destination of CPU reads, touched once here
        host.fill(scratch, 0)
        with mark(f"managed {size_mb} MiB"), torch.cuda.device(dev), torch.cuda.stream(stream):
            for i in ctx.samples():
                free, _ = torch.cuda.mem_get_info(dev)
                if not managed_bytes_allowed(n, free, ctx.env.is_grace_hopper,
                                             ctx.allow_oversubscription):
                    raise SkipRun(f"managed memory: {n / GB:.2f} GB would exceed half of the "
                                  f"GPU's free memory ({free / GB:.2f} GB) at this point")
                got: dict[str, float] = {}
                # A: allocate, GPU first touch, prefetch there and back, resident read, free.
                t0 = time.perf_counter()
                ptr = rt.malloc_managed(n)
                got["alloc_ms"] = (time.perf_counter() - t0) * 1e3
                try:
                    g = torch.as_tensor(cr.CudaArray(ptr, n), device=dev)
                    got["gpu_first_touch_gbps"] = gbps(n, _gpu_timed(torch, lambda: g.fill_(BYTE_A),
                                                                     stream))
                    if concurrent:
                        h = stream.cuda_stream
                        got["prefetch_d2h_gbps"] = gbps(n, _gpu_timed(
                            torch, lambda: rt.prefetch(ptr, n, None, h), stream))
                        got["prefetch_h2d_gbps"] = gbps(n, _gpu_timed(
                            torch, lambda: rt.prefetch(ptr, n, dev_index, h), stream))
                        got["resident_read_gbps"] = gbps(n, _gpu_timed(
                            torch, lambda: g.view(torch.int64).sum(), stream))
                    _check_gpu(g, BYTE_A, f"managed {size_mb} MiB (A)")
                    g = None
                finally:
                    rt.synchronize()
                    t0 = time.perf_counter()
                    rt.free(ptr)
                    got["free_ms"] = (time.perf_counter() - t0) * 1e3
                # B: CPU first touch, GPU read (on-demand migration), CPU read back.
                ptr = rt.malloc_managed(n)
                try:
                    a = host.view(cr.host_view(ptr, n))
                    got["cpu_first_touch_gbps"] = gbps(n, _cpu_timed(lambda: host.fill(a, BYTE_B)))
                    g = torch.as_tensor(cr.CudaArray(ptr, n), device=dev)
                    got["migrate_h2d_gbps"] = gbps(n, _gpu_timed(
                        torch, lambda: g.view(torch.int64).sum(), stream))
                    rt.synchronize()
                    got["migrate_d2h_gbps"] = gbps(n, _cpu_timed(lambda: host.copy(scratch, a)))
                    if not host.all_equal(scratch, BYTE_B):
                        raise RuntimeError(f"managed {size_mb} MiB (B): CPU read back wrong bytes")
                    a = g = None
                finally:
                    rt.synchronize()
                    rt.free(ptr)
                if ctx.timed(i):
                    for k, v in got.items():
                        s[k].append(v)
        scratch = None
        sweep.add(size_mb, {k: v for k, v in s.items() if v})


def _check_gpu(x: Any, value: int, what: str) -> None:
    if not (bool((x[:4096] == value).all()) and bool((x[-4096:] == value).all())):
        raise RuntimeError(f"{what}: the GPU write did not land")


# --------------------------------------------------------------------------- system memory
#: the figures of kind system, besides gpu_read_gbps (the main one) and alloc/free times
SYSTEM_FIGURES = ("gpu_first_touch_gbps", "gpu_write_gbps", "cpu_first_touch_gbps",
                  "gpu_read_after_cpu_gbps", "prefetch_h2d_gbps", "advised_read_gbps")


def _prepare_system(ctx: _Ctx) -> Any:
    """The runtime, once the device said it can read system memory (else SkipRun, recorded)."""
    rt = _runtime_or_skip("system-allocated memory")
    support = system_memory_support(rt, ctx.env.device)
    for k, v in system_memory_tags(support).items():
        ctx.recorder.set_tag(k, v)
    if support.reason is not None:
        raise SkipRun(f"system memory: {support.reason}")
    if not hasattr(ctx.torch._C, "_construct_storage_from_data_pointer"):
        raise SkipRun("system memory: this torch cannot wrap an unregistered host pointer as a "
                      "CUDA tensor (torch._C._construct_storage_from_data_pointer is missing)")
    ctx.recorder.set_tag("membench.alloc_api", "mmap (anonymous, private), read and written by "
                         "GPU kernels in place")
    ctx.recorder.set_tag("membench.advise_api", rt.advise_api)
    ctx.recorder.set_tag("membench.prefetch_api", rt.prefetch_api)
    ctx.recorder.set_tag("membench.thp", _thp())
    return rt


def _system_tensor(torch: Any, ptr: int, n: int, dev: Any) -> Any:
    """A CUDA uint8 tensor over ``n`` bytes of system memory at ``ptr`` (no copy, no pinning;
    torch.as_tensor would refuse an unregistered host pointer)."""
    storage = torch._C._construct_storage_from_data_pointer(ptr, dev, n)
    return torch.empty(0, dtype=torch.uint8, device=dev).set_(storage, 0, (n,), (1,))


def _system(ctx: _Ctx, sweep: SweepRecord, mark: Callable[[str], Any], rt: Any) -> None:
    """Per size, two fresh mappings: A touched first by the GPU (write, write again, read), then
    advised to prefer the GPU, prefetched there and read; B touched first by the CPU, then read
    by the GPU."""
    torch, host = ctx.torch, ctx.env.host
    dev_index = ctx.env.device
    dev = torch.device("cuda", dev_index)
    stream = torch.cuda.Stream(dev)
    names = ("alloc_ms", "free_ms", "gpu_read_gbps", *SYSTEM_FIGURES)
    for size_mb in ctx.plan.sizes_mb:
        n = size_mb * MIB
        s: dict[str, list[float]] = {k: [] for k in names}
        with mark(f"system {size_mb} MiB"), torch.cuda.device(dev), torch.cuda.stream(stream):
            for i in ctx.samples():
                got: dict[str, float] = {}
                t0 = time.perf_counter()
                mm = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                got["alloc_ms"] = (time.perf_counter() - t0) * 1e3
                a = g = None
                try:
                    a = host.view(mm)
                    ptr = int(a.ctypes.data)
                    g = _system_tensor(torch, ptr, n, dev)
                    got["gpu_first_touch_gbps"] = gbps(n, _gpu_timed(torch, lambda: g.fill_(BYTE_A),
                                                                     stream))
                    got["gpu_write_gbps"] = gbps(n, _gpu_timed(torch, lambda: g.fill_(BYTE_B),
                                                               stream))
                    got["gpu_read_gbps"] = gbps(n, _gpu_timed(
                        torch, lambda: g.view(torch.int64).sum(), stream))
                    torch.cuda.synchronize(dev)
                    if not host.all_equal(a, BYTE_B):
                        raise RuntimeError(f"system {size_mb} MiB: the GPU's write is not what "
                                           f"the CPU reads")
                    h = stream.cuda_stream
                    rt.advise(ptr, n, cr.ADVISE_SET_PREFERRED_LOCATION, dev_index)
                    rt.advise(ptr, n, cr.ADVISE_SET_ACCESSED_BY, dev_index)
                    got["prefetch_h2d_gbps"] = gbps(n, _gpu_timed(
                        torch, lambda: rt.prefetch(ptr, n, dev_index, h), stream))
                    got["advised_read_gbps"] = gbps(n, _gpu_timed(
                        torch, lambda: g.view(torch.int64).sum(), stream))
                finally:
                    torch.cuda.synchronize(dev)
                    a = g = None
                    t0 = time.perf_counter()
                    mm.close()
                    got["free_ms"] = (time.perf_counter() - t0) * 1e3
                mm = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                try:
                    a = host.view(mm)
                    got["cpu_first_touch_gbps"] = gbps(n, _cpu_timed(lambda: host.fill(a, BYTE_A)))
                    g = _system_tensor(torch, int(a.ctypes.data), n, dev)
                    got["gpu_read_after_cpu_gbps"] = gbps(n, _gpu_timed(
                        torch, lambda: g.view(torch.int64).sum(), stream))
                    _check_gpu(g, BYTE_A, f"system {size_mb} MiB (CPU first)")
                finally:
                    torch.cuda.synchronize(dev)
                    a = g = None
                    mm.close()
                if ctx.timed(i):
                    for k, v in got.items():
                        s[k].append(v)
        sweep.add(size_mb, {k: v for k, v in s.items() if v})
