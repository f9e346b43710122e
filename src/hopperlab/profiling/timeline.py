"""A profile reduced to what the ``prof_`` metrics need, and the metrics themselves.

Both sources (an Nsight Systems SQLite export, a torch profiler Chrome trace) are read into one
``Timeline`` (the capture window, GPU operations, NVTX ranges), so that a figure means the same
whichever profiler made it. The definitions of the metrics: docs/profiling.md.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

#: the GPU operation kinds a Timeline knows; copies are "memcpy_<direction>"
KERNEL = "kernel"
MEMSET = "memset"
COPY_DIRECTIONS = ("h2d", "d2h", "d2d", "h2h", "p2p", "other")
UM_DIRECTIONS = ("um_h2d", "um_d2h", "um_other")
PREFIX = "prof_"
#: at most this many NVTX range names become metrics (the longest in total time)
MAX_RANGE_METRICS = 40
DEFAULT_GAP_THRESHOLD_US = 100.0


@dataclass(frozen=True)
class GpuOp:
    """One GPU operation: ``kind`` is kernel, memset, memcpy_<dir> or um_<dir>; times in ns."""

    start: int
    end: int
    kind: str
    name: str = ""
    nbytes: int = 0

    @property
    def duration(self) -> int:
        return max(0, self.end - self.start)


@dataclass(frozen=True)
class Range:
    start: int
    end: int
    name: str


@dataclass
class Timeline:
    """What one profile recorded; ``source`` is "nsys" or "torch"."""

    source: str
    capture_start: int
    capture_end: int
    ops: list[GpuOp] = field(default_factory=list)
    ranges: list[Range] = field(default_factory=list)
    #: unified-memory page faults: {"cpu": n, "gpu": n}; None when the profile cannot say
    um_faults: dict[str, int] | None = None
    #: what the source could not give (e.g. "unified memory" for a torch trace)
    missing: list[str] = field(default_factory=list)

    @property
    def capture_ns(self) -> int:
        return max(0, self.capture_end - self.capture_start)

    def clipped(self) -> "Timeline":
        """Only what lies in the capture, cut at its edges."""
        lo, hi = self.capture_start, self.capture_end

        def cut(a: int, b: int) -> tuple[int, int] | None:
            a, b = max(a, lo), min(b, hi)
            return (a, b) if b > a else None

        ops = []
        for op in self.ops:
            span = cut(op.start, op.end)
            if span:
                ops.append(GpuOp(span[0], span[1], op.kind, op.name, op.nbytes))
        ranges = []
        for r in self.ranges:
            span = cut(r.start, r.end)
            if span:
                ranges.append(Range(span[0], span[1], r.name))
        return Timeline(self.source, lo, hi, ops, ranges, self.um_faults, list(self.missing))


def union(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The sorted, disjoint union of half-open intervals."""
    merged: list[list[int]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def idle_gaps(busy: list[tuple[int, int]], threshold_ns: float) -> list[int]:
    """Lengths of the holes between consecutive busy intervals longer than ``threshold_ns``."""
    return [b2 - b1 for (_, b1), (b2, _) in zip(busy, busy[1:]) if b2 - b1 > threshold_ns]


def metric_name(text: str) -> str:
    """A range name as a metric-name part (MLflow: letters, digits, ``_-./`` and spaces)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text.strip()).strip("_") or "unnamed"


def derive_metrics(timeline: Timeline, gap_threshold_us: float = DEFAULT_GAP_THRESHOLD_US
                   ) -> tuple[dict[str, float], dict[str, str]]:
    """The ``prof_`` metrics and ``prof.`` tags of one profile (see the module docstring)."""
    t = timeline.clipped()
    metrics: dict[str, float] = {}
    tags: dict[str, str] = {"prof.source": t.source}
    capture = t.capture_ns
    metrics["capture_s"] = capture / 1e9
    metrics["gap_threshold_us"] = float(gap_threshold_us)
    by_kind: dict[str, int] = defaultdict(int)
    bytes_by_kind: dict[str, int] = defaultdict(int)
    kernels: dict[str, int] = defaultdict(int)
    for op in t.ops:
        by_kind[op.kind] += op.duration
        bytes_by_kind[op.kind] += op.nbytes
        if op.kind == KERNEL:
            kernels[op.name] += op.duration
    total_ops = sum(by_kind.values())
    if "GPU activity" in t.missing:  # e.g. a torch trace taken without CUDA: ranges only
        _range_metrics(t, metrics, tags)
        tags["prof.missing"] = ", ".join(t.missing)
        return {PREFIX + k: float(v) for k, v in metrics.items()}, tags
    busy = union((op.start, op.end) for op in t.ops)
    busy_ns = sum(b - a for a, b in busy)
    metrics["gpu_ops"] = float(len(t.ops))
    if capture > 0:
        metrics["gpu_busy_frac"] = busy_ns / capture
    metrics["gpu_op_s"] = total_ops / 1e9
    kernel_ns = by_kind.get(KERNEL, 0)
    metrics["kernel_s"] = kernel_ns / 1e9
    metrics["kernels"] = float(sum(1 for op in t.ops if op.kind == KERNEL))
    if kernels:
        top, top_ns = max(kernels.items(), key=lambda kv: (kv[1], kv[0]))
        tags["prof.top_kernel"] = top[:500]
        metrics["top_kernel_share"] = top_ns / kernel_ns if kernel_ns else 0.0
        if total_ops:
            metrics["top_kernel_gpu_share"] = top_ns / total_ops
    memops = {k: v for k, v in by_kind.items() if k != KERNEL}
    if total_ops:
        metrics["kernel_share"] = kernel_ns / total_ops
        metrics["memops_share"] = sum(memops.values()) / total_ops
    for kind, ns in sorted(memops.items()):
        metrics[f"{kind}_s"] = ns / 1e9
        if total_ops:
            metrics[f"{kind}_share"] = ns / total_ops
        if kind != MEMSET:
            metrics[f"{kind}_bytes"] = float(bytes_by_kind[kind])
            if ns:
                metrics[f"{kind}_gbps"] = bytes_by_kind[kind] / ns  # bytes per ns = GB/s
    um_ns = sum(ns for k, ns in memops.items() if k.startswith("um_"))
    if "unified memory" not in t.missing:
        metrics["um_s"] = um_ns / 1e9
        metrics["um_share"] = um_ns / total_ops if total_ops else 0.0
        metrics["um_bytes"] = float(sum(b for k, b in bytes_by_kind.items() if k.startswith("um_")))
        memop_ns = sum(memops.values())
        metrics["um_memops_share"] = um_ns / memop_ns if memop_ns else 0.0
    if t.um_faults is not None:
        for where, n in sorted(t.um_faults.items()):
            metrics[f"um_{where}_faults"] = float(n)
    gaps = idle_gaps(busy, gap_threshold_us * 1e3)
    metrics["gpu_idle_gaps"] = float(len(gaps))
    metrics["gpu_idle_gap_s"] = sum(gaps) / 1e9
    if capture > 0:
        metrics["gpu_idle_gap_frac"] = sum(gaps) / capture
    if gaps:
        metrics["gpu_idle_gap_max_ms"] = max(gaps) / 1e6
    _range_metrics(t, metrics, tags)
    if t.missing:
        tags["prof.missing"] = ", ".join(t.missing)
    return {PREFIX + k: float(v) for k, v in metrics.items()}, tags


def _range_metrics(t: Timeline, metrics: dict[str, float], tags: dict[str, str]) -> None:
    """Total, count and mean time of each range name (the longest MAX_RANGE_METRICS)."""
    totals: dict[str, list[int]] = defaultdict(list)
    for r in t.ranges:
        totals[r.name].append(r.end - r.start)
    longest = sorted(totals.items(), key=lambda kv: (-sum(kv[1]), kv[0]))[:MAX_RANGE_METRICS]
    for name, durations in longest:
        key = metric_name(name)
        metrics[f"nvtx_{key}_s"] = sum(durations) / 1e9
        metrics[f"nvtx_{key}_count"] = float(len(durations))
        metrics[f"nvtx_{key}_mean_ms"] = sum(durations) / len(durations) / 1e6
    if len(totals) > MAX_RANGE_METRICS:
        tags["prof.nvtx_ranges_left_out"] = str(len(totals) - MAX_RANGE_METRICS)


def kernel_table(timeline: Timeline, top: int = 20) -> list[dict[str, float | str]]:
    """The ``top`` kernels by total time in the capture, for the run's profile summary."""
    t = timeline.clipped()
    totals: dict[str, list[int]] = defaultdict(list)
    for op in t.ops:
        if op.kind == KERNEL:
            totals[op.name].append(op.duration)
    all_ns = sum(sum(v) for v in totals.values()) or 1
    rows = sorted(totals.items(), key=lambda kv: -sum(kv[1]))[:top]
    return [{"kernel": name, "total_ms": sum(d) / 1e6, "count": len(d),
             "share": sum(d) / all_ns} for name, d in rows]
