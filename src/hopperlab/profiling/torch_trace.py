"""Read a torch profiler Chrome trace (``export_chrome_trace``) into a ``Timeline``.

The trace holds complete events (``"ph": "X"``, times in microseconds) by category: ``kernel``,
``gpu_memcpy`` (name "Memcpy HtoD (Pinned -> Device)", bytes in ``args``), ``gpu_memset``,
``user_annotation`` (``record_function``, which ``hopperlab.cuda.nvtx.nvtx_range`` opens beside each
NVTX range), and CPU operators. The capture is the span of all its complete events.

What a torch trace cannot give: unified-memory migrations and page faults (CUPTI's unified-memory
records are not in it), so ``um_*`` metrics are left out and ``prof.missing`` says so. On a node
without CUDA, only the ranges (and the capture) are there.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

from hopperlab.profiling.timeline import KERNEL, MEMSET, GpuOp, Range, Timeline
from hopperlab.core.errors import HopperlabError

KERNEL_CATS = frozenset({"kernel"})
MEMCPY_CATS = frozenset({"gpu_memcpy"})
MEMSET_CATS = frozenset({"gpu_memset"})
RANGE_CATS = frozenset({"user_annotation"})
_DIRECTIONS = {"htod": "h2d", "dtoh": "d2h", "dtod": "d2d", "htoh": "h2h", "ptop": "p2p"}


class NotATrace(HopperlabError, ValueError):
    """The file is not a torch profiler Chrome trace."""


def copy_direction(name: str) -> str:
    """``memcpy_h2d`` from "Memcpy HtoD (Pinned -> Device)"."""
    m = re.search(r"memcpy\s+(\w+)", name, re.IGNORECASE)
    return f"memcpy_{_DIRECTIONS.get(m.group(1).lower(), 'other') if m else 'other'}"


def _ns(us: Any) -> int:
    return int(round(float(us) * 1000))


def read_timeline(path: Path | str) -> Timeline:
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":  # export_chrome_trace("....json.gz") writes gzip
            raw = gzip.decompress(raw)
        data = json.loads(raw)
    except (OSError, ValueError) as exc:
        raise NotATrace(f"{path}: {exc}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise NotATrace(f"{path}: no traceEvents list")
    ops: list[GpuOp] = []
    ranges: list[Range] = []
    lo: int | None = None
    hi: int | None = None
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X" or "ts" not in ev:
            continue
        start = _ns(ev["ts"])
        end = start + _ns(ev.get("dur", 0))
        lo = start if lo is None else min(lo, start)
        hi = end if hi is None else max(hi, end)
        cat = str(ev.get("cat", ""))
        name = str(ev.get("name", ""))
        args = ev.get("args") or {}
        if cat in KERNEL_CATS:
            ops.append(GpuOp(start, end, KERNEL, name))
        elif cat in MEMCPY_CATS:
            ops.append(GpuOp(start, end, copy_direction(name), name, int(args.get("bytes", 0))))
        elif cat in MEMSET_CATS:
            ops.append(GpuOp(start, end, MEMSET, name, int(args.get("bytes", 0))))
        elif cat in RANGE_CATS:
            ranges.append(Range(start, end, name))
    if lo is None or hi is None:
        raise NotATrace(f"{path}: the trace holds no complete events")
    missing = ["unified memory"]
    if not ops:
        missing.append("GPU activity")
    return Timeline("torch", lo, hi, ops, ranges, None, missing)
