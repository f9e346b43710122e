"""The copy test: host<->device copy bandwidth over a sweep of sizes.

Pinned or pageable host buffers against device (or managed) buffers, copies back to back between
CUDA events (one stream each way for ``bidir``), the median of ``repeats`` samples in GB/s
(1e9 B/s), every destination checked afterwards. Without a CUDA device pageable variants time
host memcpy instead and pinned ones are skipped. The method in detail:
docs/benchmarks/membench.md.
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from typing import Any, Callable

from hopperlab.core.rundir import SkipRun
from hopperlab.core.stats import GB, MIB, gbps
from hopperlab.cuda.managed_policy import managed_bytes_allowed
from hopperlab.cuda.runtime import CudaArray, CudaError, CudaRuntime
from hopperlab.workloads.base import Recording
from hopperlab.workloads.membench import MembenchParams
from hopperlab.workloads.membench.moved import PROBE_BYTES, MovedBytes
from hopperlab.workloads.sameness import add_evidence
from hopperlab.workloads.membench.common import (Env, Plan, SweepRecord, bytes_copied,
                                                 inner_copies, log_finite)

#: every byte the sweep's copies moved inside the measured window (GB, 1e9 B), warm-ups included
MEASURED_GB_COPIED = "measured_gb_copied"
SRC_BYTE = 0x5A
DST_BYTE = 0x11
#: spin-kernel cycles per queued copy (25 us at 2 GHz: more than issuing a copy takes)
SLEEP_CYCLES_PER_COPY = 50_000
MAX_SLEEP_CYCLES = 50_000_000


def check_copy(env: Env, params: MembenchParams, memory: str) -> None:
    """Raise SkipRun when this node cannot run the variant (before anything is set up)."""
    if env.target != "cuda":
        if params.host_memory == "pinned":
            raise SkipRun(f"pinned host memory needs a CUDA device: {env.no_cuda_reason}")
        if memory == "managed":
            raise SkipRun(f"memory=managed needs a CUDA device: {env.no_cuda_reason}")


def run_copy(env: Env, params: MembenchParams, plan: Plan, recorder: Recording, *, memory: str,
             allow_oversubscription: bool, mark: Callable[[str], Any]) -> None:
    recorder.set_tag("membench.direction", params.direction)
    recorder.set_tag("membench.host_memory", params.host_memory)
    check_copy(env, params, memory)
    if env.target != "cuda":
        _host_memcpy(env, params, plan, recorder, mark)
        return
    _cuda_copies(env, params, plan, recorder, memory=memory,
                 allow_oversubscription=allow_oversubscription, mark=mark)


# --------------------------------------------------------------------------- host stand-in
def _host_memcpy(env: Env, params: MembenchParams, plan: Plan, recorder: Recording,
                 mark: Callable[[str], Any]) -> None:
    host = env.host
    bidir = params.direction == "bidir"
    prefix = "memcpy_x2" if bidir else "memcpy"
    recorder.set_tag("membench.stand_in",
                     f"host memcpy in place of {params.direction} copies: {env.no_cuda_reason}")
    recorder.set_tag("membench.timer", "perf_counter")
    sweep = SweepRecord(recorder, prefix, main="gbps")
    copied = 0
    moved = MovedBytes()
    for size_mb in plan.sizes_mb:
        n = size_mb * MIB
        inner = inner_copies(n, plan.sample_bytes)
        copied += bytes_copied(n, inner, 2 if bidir else 1, plan)
        pairs = []
        for _ in range(2 if bidir else 1):
            src, dst = host.empty(n), host.empty(n)
            host.fill(src, SRC_BYTE)
            host.fill(dst, DST_BYTE)
            pairs.append((dst, src))
        samples: list[float] = []
        with mark(f"{prefix} {size_mb} MiB"):
            for i in range(plan.warmup + plan.repeats):
                if bidir:
                    seconds = _threads_sample([lambda d=d, s=s: host.copy(d, s) for d, s in pairs],
                                              inner, sync=None)[0]
                else:
                    dst, src = pairs[0]
                    t0 = time.perf_counter()
                    for _ in range(inner):
                        host.copy(dst, src)
                    seconds = time.perf_counter() - t0
                if i >= plan.warmup:
                    samples.append(gbps(n * inner * len(pairs), seconds))
        for dst, _src in pairs:
            if not host.all_equal(dst, SRC_BYTE):
                raise RuntimeError(f"host memcpy of {size_mb} MiB: destination does not hold "
                                   f"the source bytes")
            moved.add(size_mb, dst[:PROBE_BYTES].tobytes(), dst[-PROBE_BYTES:].tobytes())
        sweep.add(size_mb, {"gbps": samples}, inner=inner)
        del pairs
    _finish(sweep, recorder, copied, moved)


def _threads_sample(works: list[Callable[[], None]], inner: int,
                    sync: list[Callable[[], None]] | None) -> list[float]:
    """Run each work ``inner`` times in its own thread, all released by one barrier; return
    [seconds until the last finished, seconds of each work]."""
    barrier = threading.Barrier(len(works) + 1)
    done: dict[int, float] = {}
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            barrier.wait()
            for _ in range(inner):
                works[k]()
            if sync is not None:
                sync[k]()
            done[k] = time.perf_counter()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)
            done[k] = time.perf_counter()

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(len(works))]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    each = [done[k] - t0 for k in range(len(works))]
    return [max(each), *each]


# --------------------------------------------------------------------------- CUDA
def _cuda_copies(env: Env, params: MembenchParams, plan: Plan, recorder: Recording, *, memory: str,
                 allow_oversubscription: bool, mark: Callable[[str], Any]) -> None:
    torch = env.torch
    dev = torch.device("cuda", env.device)
    pinned = params.host_memory == "pinned"
    direction = params.direction
    bidir = direction == "bidir"
    sleep_ok = pinned and hasattr(torch.cuda, "_sleep")
    recorder.set_tag("membench.device_memory", memory)
    recorder.set_tag("membench.timer", "cuda_events" if pinned or not bidir
                     else "perf_counter (two threads)")
    recorder.set_tag("membench.spin_kernel", str(sleep_ok).lower())
    runtime = None
    if memory == "managed":
        try:
            runtime = CudaRuntime()
        except CudaError as exc:
            raise SkipRun(f"memory=managed needs the CUDA runtime library: {exc}") from None
        need = plan.largest_mb * MIB * (2 if bidir else 1)
        free, _ = torch.cuda.mem_get_info(env.device)
        if not managed_bytes_allowed(need, free, env.is_grace_hopper, allow_oversubscription):
            raise SkipRun(_managed_refusal(need, free))
        recorder.set_tag("membench.cudart", runtime.path)

    sweep = SweepRecord(recorder, direction, main="gbps")
    s_main, s_a, s_b = torch.cuda.Stream(dev), torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    copied = 0
    moved = MovedBytes()
    for size_mb in plan.sizes_mb:
        n = size_mb * MIB
        inner = inner_copies(n, plan.sample_bytes)
        copied += bytes_copied(n, inner, 2 if bidir else 1, plan)
        with ExitStack() as stack:
            def device_buffer() -> Any:
                if runtime is None:
                    return torch.empty(n, dtype=torch.uint8, device=dev)
                ptr = stack.enter_context(runtime.managed(n))
                t = torch.as_tensor(CudaArray(ptr, n), device=dev)
                runtime.prefetch(ptr, n, env.device, torch.cuda.current_stream(dev).cuda_stream)
                return t

            def host_buffer() -> Any:
                return torch.empty(n, dtype=torch.uint8, pin_memory=pinned)

            h2d = d2h = None
            if direction in ("h2d", "bidir"):
                h2d = (device_buffer(), host_buffer())  # (dst, src)
                h2d[1].fill_(SRC_BYTE)
                h2d[0].fill_(DST_BYTE)
            if direction in ("d2h", "bidir"):
                d2h = (host_buffer(), device_buffer())
                d2h[1].fill_(SRC_BYTE)
                d2h[0].fill_(DST_BYTE)
            torch.cuda.synchronize(dev)
            sleep = min(MAX_SLEEP_CYCLES, SLEEP_CYCLES_PER_COPY * inner * (2 if bidir else 1)) \
                if sleep_ok else 0

            total: list[float] = []
            per_dir: dict[str, list[float]] = {"h2d_gbps": [], "d2h_gbps": []}
            with mark(f"{direction} {params.host_memory} {size_mb} MiB"):
                for i in range(plan.warmup + plan.repeats):
                    if not bidir:
                        dst, src = h2d if h2d is not None else d2h  # type: ignore[misc]
                        seconds = _events_sample(torch, [(dst, src)], [s_main], inner, sleep,
                                                 s_main)[0]
                        each = None
                    elif pinned:
                        seconds, *each = _events_sample(torch, [h2d, d2h], [s_a, s_b], inner,
                                                        sleep, s_main)
                    else:
                        seconds, *each = _pageable_bidir_sample(torch, dev, h2d, d2h, inner,
                                                                s_a, s_b)
                    if i < plan.warmup:
                        continue
                    total.append(gbps(n * inner * (2 if bidir else 1), seconds))
                    if bidir and each:
                        per_dir["h2d_gbps"].append(gbps(n * inner, each[0]))
                        per_dir["d2h_gbps"].append(gbps(n * inner, each[1]))
            torch.cuda.synchronize(dev)
            for pair in (h2d, d2h):
                if pair is None:
                    continue
                dst = pair[0]
                ok = bool((dst[:4096] == SRC_BYTE).all()) and bool((dst[-4096:] == SRC_BYTE).all())
                if not ok:
                    raise RuntimeError(f"{direction} copy of {size_mb} MiB: destination does not "
                                       f"hold the source bytes")
                moved.add(size_mb, dst[:PROBE_BYTES].cpu().numpy().tobytes(),
                          dst[-PROBE_BYTES:].cpu().numpy().tobytes())
            samples = {"gbps": total, **(per_dir if bidir else {})}
            sweep.add(size_mb, samples, inner=inner)
            del h2d, d2h
        torch.cuda.empty_cache()
    _finish(sweep, recorder, copied, moved)
    if bidir:
        log_finite(recorder, "h2d_gbps_at_largest", sweep.largest("h2d_gbps"))
        log_finite(recorder, "d2h_gbps_at_largest", sweep.largest("d2h_gbps"))


def _events_sample(torch: Any, pairs: list[Any], streams: list[Any], inner: int, sleep: int,
                   s_main: Any) -> list[float]:
    """Time ``inner`` copies of each (dst, src) pair, pair k on streams[k], all released by one
    start event; return [seconds until the last stream finished, seconds of each stream]."""
    start = torch.cuda.Event(enable_timing=True)
    ends = [torch.cuda.Event(enable_timing=True) for _ in pairs]
    with torch.cuda.stream(s_main):
        if sleep:
            torch.cuda._sleep(sleep)
        start.record(s_main)
    for s in streams:
        if s is not s_main:
            s.wait_event(start)
    for _ in range(inner):
        for (dst, src), s in zip(pairs, streams):
            with torch.cuda.stream(s):
                dst.copy_(src, non_blocking=True)
    for e, s in zip(ends, streams):
        e.record(s)
    for e in ends:
        e.synchronize()
    each = [start.elapsed_time(e) / 1e3 for e in ends]
    return [max(each), *each]


def _pageable_bidir_sample(torch: Any, dev: Any, h2d: Any, d2h: Any, inner: int, s_a: Any,
                           s_b: Any) -> list[float]:
    """Pageable copies block the issuing thread: one thread per direction, host-clock timed."""

    def work(pair: Any, stream: Any) -> Callable[[], None]:
        def go() -> None:
            with torch.cuda.device(dev), torch.cuda.stream(stream):
                pair[0].copy_(pair[1], non_blocking=True)
        return go

    return _threads_sample([work(h2d, s_a), work(d2h, s_b)], inner,
                           sync=[s_a.synchronize, s_b.synchronize])


def _managed_refusal(need: int, free: int | None) -> str:
    free_txt = f"{free / GB:.2f} GB" if free is not None else "unknown"
    return (f"managed memory: {need / GB:.2f} GB asked for, but at most half of the GPU's free "
            f"memory ({free_txt}) may be managed on a node that is not Grace Hopper unless the "
            f"site sets allow_oversubscription: true")


def _finish(sweep: SweepRecord, recorder: Recording, copied: int, moved: MovedBytes) -> None:
    sweep.write()
    add_evidence(recorder, "checksum", moved.checksum())  # compared between variants
    # the work inside the measured window (the sweep): what its joules are divided by
    recorder.log_metric(MEASURED_GB_COPIED, copied / GB)
    log_finite(recorder, "gbps_peak", sweep.peak("gbps"))
    log_finite(recorder, "gbps_at_largest", sweep.largest("gbps"))
    log_finite(recorder, "largest_size_mb", sweep.rows[-1]["size_mb"] if sweep.rows else float("nan"))
