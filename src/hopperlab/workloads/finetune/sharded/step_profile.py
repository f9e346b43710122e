"""Where a sharded step's time goes on the GPU, from one profiled step reduced to a few numbers
(issue 35: the FSDP2 offloaded steps ran ~1.1 s (2 GPUs) and ~3.6 s (1 GPU) longer than their
GPU compute while the step waited almost nothing for the CPU optimizer; the record could not
say whether the GPU sat idle, waited for parameter copies slowed by the optimizer's memory
traffic, or ran its kernels slower).

One extra step after the measured ones (so the profiler's cost is in no measured figure) runs
under ``torch.profiler`` with the CUDA activity only; its trace is reduced here to: the GPU's
busy and idle time (the union of kernels and copies against the step's wall time), the time no
compute kernel ran, kernel time by kind (matrix products, attention, compiled Triton kernels,
other element-wise kernels, NCCL), NCCL time not hidden by compute, and the copies each way with
the rate they reached while copying (against the pinned rate measured alone: below it, they
shared host memory with something). ``summarize`` is pure (tests feed it a trace).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any, Callable, Iterable

#: kernel-name fragments of each kind (lower case), first match wins; "other" is the rest
KINDS = (("nccl", ("nccl",)),
         ("attention", ("flash", "fmha", "attention", "sdpa")),
         ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "sm100_")),
         ("triton", ("triton",)))


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, fragments in KINDS:
        if any(f in low for f in fragments):
            return kind
    return "other"


def union_s(spans: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by ``spans`` (start, end) in microseconds, overlaps counted once."""
    total, end = 0.0, -float("inf")
    for lo, hi in sorted(spans):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total / 1e6


def _overlap_s(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Seconds where both span sets are active: |A| + |B| - |A or B|."""
    return max(0.0, union_s(a) + union_s(b) - union_s(a + b))


def summarize(trace: dict[str, Any], wall_s: float) -> dict[str, float]:
    """The profiled step's figures (``diag_*``) from a Chrome trace of torch.profiler's CUDA
    activity and the step's wall-clock seconds."""
    kernels: dict[str, list[tuple[float, float]]] = {k: [] for k, _ in KINDS}
    kernels["other"] = []
    copies: dict[str, list[tuple[float, float]]] = {"h2d": [], "d2h": [], "other": []}
    copy_bytes = {"h2d": 0.0, "d2h": 0.0, "other": 0.0}
    sets: list[tuple[float, float]] = []
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        cat = str(ev.get("cat", "")).lower()
        span = (float(ev["ts"]), float(ev["ts"]) + float(ev["dur"]))
        name = str(ev.get("name", ""))
        if cat == "kernel":
            kernels[kind_of(name)].append(span)
        elif cat == "gpu_memcpy":
            way = "h2d" if "htod" in name.lower() else "d2h" if "dtoh" in name.lower() else "other"
            copies[way].append(span)
            copy_bytes[way] += float((ev.get("args") or {}).get("bytes", 0) or 0)
        elif cat == "gpu_memset":
            sets.append(span)
    compute = [s for k, spans in kernels.items() if k != "nccl" for s in spans]
    everything = compute + kernels["nccl"] + sets + [s for v in copies.values() for s in v]
    busy = union_s(everything)
    compute_s = union_s(compute)
    out = {"diag_step_s": wall_s, "diag_gpu_busy_s": busy,
           "diag_gpu_idle_s": max(0.0, wall_s - busy),
           "diag_compute_s": compute_s, "diag_no_compute_s": max(0.0, wall_s - compute_s),
           "diag_kernels": float(sum(len(v) for v in kernels.values())),
           "diag_nccl_exposed_s": max(0.0, union_s(kernels["nccl"])
                                      - _overlap_s(kernels["nccl"], compute))}
    for kind, spans in kernels.items():  # summed, not united: concurrent kernels add up
        out[f"diag_{kind}_kernel_s"] = sum(hi - lo for lo, hi in spans) / 1e6
    for way in ("h2d", "d2h"):
        seconds = union_s(copies[way])
        out[f"diag_{way}_s"] = seconds
        out[f"diag_{way}_gb"] = copy_bytes[way] / 1e9
        if seconds > 0 and copy_bytes[way] > 0:
            out[f"diag_{way}_gbps"] = copy_bytes[way] / seconds / 1e9
        # copies with no compute kernel beside them: time the GPU's math waited on the link
        out[f"diag_{way}_exposed_s"] = max(0.0, seconds - _overlap_s(copies[way], compute))
    return out


def profile_step(step: Callable[[], Any], sync: Callable[[], None],
                 cuda: bool = True) -> tuple[Any, dict[str, float], str | None]:
    """Run ``step`` once under torch.profiler (the CUDA activity only: the GPU's kernels and
    copies, few CPU events; ``cuda`` false: the CPU's, for tests), between two ``sync`` calls.
    Returns its result, the trace's figures (``summarize``) and why there are none (None: there
    are). The step runs whatever the profiler does, so that the ranks' collectives still pair;
    the trace itself is not kept (tens of MB for a 13B step)."""
    from torch.profiler import ProfilerActivity, profile

    prof, why = None, None
    try:
        prof = profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU])
        prof.__enter__()
    except Exception as exc:  # noqa: BLE001 - a profiler that cannot start costs the figures only
        prof, why = None, f"the profiler did not start: {type(exc).__name__}: {exc}"
    sync()
    t0 = time.perf_counter()
    result = step()
    sync()
    wall = time.perf_counter() - t0
    if prof is None:
        return result, {"diag_step_s": wall}, why
    try:
        prof.__exit__(None, None, None)
        fd, path = tempfile.mkstemp(suffix=".json", prefix="step-trace-")
        os.close(fd)
        try:
            prof.export_chrome_trace(path)
            with open(path, encoding="utf-8") as fh:
                trace = json.load(fh)
        finally:
            os.unlink(path)
    except Exception as exc:  # noqa: BLE001 - as above
        return result, {"diag_step_s": wall}, f"the trace was not read: {type(exc).__name__}: {exc}"
    return result, summarize(trace, wall), None
