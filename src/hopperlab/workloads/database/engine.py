"""Timing one query plan on one source, and the per-query figures every run records.

A timed run is the whole plan, answer included, between two CUDA events (the host clock on the
CPU), after an untimed ``source.reset()``; the median of ``repeats`` after ``warmup`` is
reported. ``QueryFigures.metrics`` names each figure (``<query>_<name>``); their definitions:
docs/benchmarks/database.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from hopperlab.core.stats import GB, gbps
from hopperlab.workloads.database.plans import PLANS

HOST_RESIDENT = ("host-pinned", "zero-copy", "managed", "pageable", "system")


@dataclass
class QueryRun:
    query: str
    rows: list[tuple]
    times_ms: list[float]
    bytes_read: int

    @property
    def time_ms(self) -> float:
        s = sorted(self.times_ms)
        mid = len(s) // 2
        return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def time_plan(source: Any, plan: Callable[[Any], list[tuple]], warmup: int, repeats: int,
              on_sample: Callable[[int, float], None] | None = None,
              query: str = "") -> QueryRun:
    cuda = source.device.type == "cuda"
    rows: list[tuple] = []
    times: list[float] = []
    bytes_read = 0
    for i in range(warmup + repeats):
        source.reset()
        if cuda:
            torch.cuda.synchronize(source.device)
            stream = torch.cuda.current_stream(source.device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            rows = plan(source)
            end.record(stream)
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            rows = plan(source)
            ms = (time.perf_counter() - t0) * 1e3
        bytes_read = source.bytes_read
        if i >= warmup:
            times.append(ms)
            if on_sample is not None:
                on_sample(i - warmup, ms)
    return QueryRun(query, rows, times, bytes_read)


def run_query(source: Any, query: str, warmup: int, repeats: int,
              on_sample: Callable[[int, float], None] | None = None) -> QueryRun:
    return time_plan(source, PLANS[query], warmup, repeats, on_sample, query)


@dataclass
class QueryFigures:
    query: str
    time_ms: float
    bytes_read: int
    duckdb_ms: float
    correct: bool
    link_gbps: float | None
    host_resident: bool
    extra: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        rate = gbps(self.bytes_read, self.time_ms / 1e3)
        out = {"time_ms": self.time_ms, "bytes_read": float(self.bytes_read), "gbps": rate,
               "duckdb_ms": self.duckdb_ms,
               "speedup_vs_duckdb": self.duckdb_ms / self.time_ms if self.time_ms > 0 else math.nan,
               "correct": 1.0 if self.correct else 0.0}
        if self.link_gbps and self.host_resident:
            out["link_fraction"] = rate / self.link_gbps
        if self.link_gbps:
            out["floor_ms"] = self.bytes_read / (self.link_gbps * GB) * 1e3
        out.update(self.extra)
        return {f"{self.query}_{k}": float(v) for k, v in out.items() if math.isfinite(v)}
