"""database: TPC-H queries on the GPU over tables in CPU or GPU memory, checked against DuckDB
(FAMILY, params).

Six TPC-H queries as plans of PyTorch operators, in five data placements and two column
encodings, each answer checked against DuckDB on the same data (also the speed peer): is the host
link the bottleneck when the tables live in CPU memory? Cheap to import (no torch, numpy or
duckdb): the spec layer reads it. The claim and the modules: docs/benchmarks/database.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from hopperlab.core.schema import bounded, settle_fields
from hopperlab.workloads.base import (HIGHER, LOWER, PROFILERS, Contradiction, FamilyInfo, Knobs,
                                      WorkUnit)

Query = Literal["q1", "q3", "q5", "q6", "q12", "q14"]
QUERIES: tuple[str, ...] = get_args(Query)
#: device: columns in GPU memory before timing; host-pinned: pinned host memory, streamed in
#: chunks by copy engines on a side stream (double buffered); zero-copy: kernels read mapped
#: pinned host memory; managed: cudaMallocManaged, host-resident at the start of each query
#: (prefetched chunk by chunk on a side stream, or migrated by page faults); pageable: copies
#: from ordinary host memory; system: ordinary (malloc'd, unpinned) host memory read by the
#: kernels in place, no copies (only where the device reports pageableMemoryAccess: Grace
#: Hopper, x86 with HMM; with the knob memory: system).
Placement = Literal["device", "host-pinned", "zero-copy", "managed", "pageable", "system"]
PLACEMENTS: tuple[str, ...] = get_args(Placement)
#: plain: int32 days, int64 cents, int32 dictionary codes, int64 keys; compact: each column in
#: its narrowest exact form (frame of reference and common factor), widened on the GPU.
Encoding = Literal["plain", "compact"]
ENCODINGS: tuple[str, ...] = get_args(Encoding)

#: per-query metric names: ``<query>_<name>`` (e.g. ``q6_time_ms``)
QUERY_METRICS = ("time_ms", "bytes_read", "gbps", "link_fraction", "floor_ms", "duckdb_ms",
                 "speedup_vs_duckdb", "correct")
HEADLINE_METRICS: tuple[str, ...] = tuple(f"{q}_time_ms" for q in QUERIES) + tuple(
    f"{q}_speedup_vs_duckdb" for q in QUERIES) + ("all_correct",)


@dataclass(frozen=True)
class DatabaseParams:
    #: queries to run, in order (each checked against DuckDB)
    queries: tuple[Query, ...] = bounded(QUERIES, min_len=1, unique=True)
    #: where the columns live while the query runs (see PLACEMENTS)
    placement: Placement = "device"
    #: column form in memory: plain or compact (see ENCODINGS)
    encoding: Encoding = "plain"
    #: managed placement only: prefetch each chunk to the GPU ahead of use (else page faults)
    prefetch: bool = True
    #: Q1 and Q6 as one fused Triton kernel per chunk where Triton runs (GPU); false: PyTorch
    #: operators only (``fused.py`` says why the fused form exists)
    fused_kernels: bool = True
    # the sizes below are the smoke scale's; experiments/database.yaml's ``scales:`` sets each
    # scale's (the workload reads params only, never the scale's name)
    #: rows per streamed chunk (host placements)
    chunk_rows: int = bounded(16_384, at_least=1)
    #: timed runs per query (the median is reported)
    repeats: int = bounded(2, at_least=1)
    #: untimed runs per query before the timed ones
    warmup: int = bounded(1, at_least=0)
    #: DuckDB threads; None: the job's CPUs (hopperlab.node.threads, set by the runner), else
    #: all of the node's cores
    duckdb_threads: int | None = bounded(None, at_least=1)
    #: pinned host->device GB/s of the node for link_fraction; None: measured at the start
    link_gbps: float | None = bounded(None, above=0)

    def __post_init__(self) -> None:
        settle_fields(self)  # every bound is declared on its field; no two fields go together


def check(knobs: Knobs, params: DatabaseParams) -> None:
    """Refuse a variant whose knobs contradict its params (``FamilyInfo.check``): the memory
    knob and the placement name the same memory, or neither names managed or system."""
    for kind in ("managed", "system"):
        if (knobs.memory == kind) != (params.placement == kind):
            raise Contradiction("memory", f"{knobs.memory!r} with placement {params.placement!r}: "
                                f"memory: {kind} goes with placement: {kind}, and only with it")


#: which way each figure is better, what a run's cost is divided by, and link floors
METRIC_DIRECTIONS = {**{f"{q}_time_ms": LOWER for q in QUERIES},
              **{f"{q}_speedup_vs_duckdb": HIGHER for q in QUERIES},
              **{f"{q}_gbps": HIGHER for q in QUERIES}, "all_correct": HIGHER}
WORK_UNITS = (WorkUnit("cost_per_1k_queries", "per 1000 queries", 1e3, "count_per_ms",
                       time_suffix="_time_ms", work_per_j="queries_per_j",
                       work_label="queries per joule", done=("measured_queries",)),
              WorkUnit("cost_per_tb_scanned", "per TB scanned", 1e12, "sum_per_ms",
                       "_bytes_read", time_suffix="_time_ms", work_per_j="gb_scanned_per_j",
                       work_label="GB scanned per joule", work_scale=1e9,
                       done=("measured_bytes_scanned",)),
              # the DuckDB peer on the host's cores, in its own energy window (energy only)
              WorkUnit("cost_per_1k_duckdb_queries", "per 1000 DuckDB queries", 1e3,
                       "count_per_ms", time_suffix="_duckdb_ms",
                       work_per_j="duckdb_queries_per_j", work_label="DuckDB queries per joule",
                       window="duckdb", done=("duckdb_measured_queries",)))
FLOORS = {f"{q}_time_ms": f"{q}_floor_ms" for q in QUERIES}

FAMILY = FamilyInfo(
    name="database",
    entry="hopperlab.workloads.database.workload:run",
    sameness="hopperlab.workloads.database.sameness:rule",
    predict="hopperlab.workloads.database.predict:MODEL",
    supported_knobs={
        "memory": frozenset({"device", "managed", "system"}),
        "profiler": PROFILERS,
    },
    params=DatabaseParams,
    headline_metrics=HEADLINE_METRICS,
    charts="hopperlab.workloads.database.charts:charts",
    directions=METRIC_DIRECTIONS,
    judged=("q*_time_ms",),
    work_units=WORK_UNITS,
    floors=FLOORS,
    check=check,
    # loading the tables and the DuckDB answers take most of a run: windows of the queries
    repeat_unit="windows",
)
