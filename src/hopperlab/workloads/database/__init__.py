"""database: TPC-H queries on the GPU over tables in CPU or GPU memory, checked against DuckDB
(FAMILY, params).

Six TPC-H queries as plans of PyTorch operators, in five data placements and two column
encodings, each answer checked against DuckDB on the same data (also the speed peer): is the host
link the bottleneck when the tables live in CPU memory? Cheap to import (no torch, numpy or
duckdb): the spec layer reads it. The claim and the modules: docs/benchmarks/database.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from hopperlab.workloads.base import (HIGHER, LOWER, PROFILERS, Contradiction, FamilyInfo, Knobs,
                                      WorkUnit)

QUERIES = ("q1", "q3", "q5", "q6", "q12", "q14")
#: device: columns in GPU memory before timing; host-pinned: pinned host memory, streamed in
#: chunks by copy engines on a side stream (double buffered); zero-copy: kernels read mapped
#: pinned host memory; managed: cudaMallocManaged, host-resident at the start of each query
#: (prefetched chunk by chunk on a side stream, or migrated by page faults); pageable: copies
#: from ordinary host memory; system: ordinary (malloc'd, unpinned) host memory read by the
#: kernels in place, no copies (only where the device reports pageableMemoryAccess: Grace
#: Hopper, x86 with HMM; with the knob memory: system).
PLACEMENTS = ("device", "host-pinned", "zero-copy", "managed", "pageable", "system")
#: plain: int32 days, int64 cents, int32 dictionary codes, int64 keys; compact: each column in
#: its narrowest exact form (frame of reference and common factor), widened on the GPU.
ENCODINGS = ("plain", "compact")

DEFAULT_REPEATS = {"smoke": 2, "full": 10}
DEFAULT_WARMUP = {"smoke": 1, "full": 2}
DEFAULT_CHUNK_ROWS = {"smoke": 16_384, "full": 16 * 2**20}

#: per-query metric names: ``<query>_<name>`` (e.g. ``q6_time_ms``)
QUERY_METRICS = ("time_ms", "bytes_read", "gbps", "link_fraction", "floor_ms", "duckdb_ms",
                 "speedup_vs_duckdb", "correct")
HEADLINE_METRICS: tuple[str, ...] = tuple(f"{q}_time_ms" for q in QUERIES) + tuple(
    f"{q}_speedup_vs_duckdb" for q in QUERIES) + ("all_correct",)


@dataclass(frozen=True)
class DatabaseParams:
    #: queries to run, in order (each checked against DuckDB)
    queries: tuple[str, ...] = QUERIES
    #: where the columns live while the query runs (see PLACEMENTS)
    placement: str = "device"
    #: column form in memory: plain or compact (see ENCODINGS)
    encoding: str = "plain"
    #: managed placement only: prefetch each chunk to the GPU ahead of use (else page faults)
    prefetch: bool = True
    #: Q1 and Q6 as one fused Triton kernel per chunk where Triton runs (GPU); false: PyTorch
    #: operators only (``fused.py`` says why the fused form exists)
    fused_kernels: bool = True
    #: rows per streamed chunk (host placements); None: DEFAULT_CHUNK_ROWS of the scale
    chunk_rows: int | None = None
    #: timed runs per query (the median is reported); None: DEFAULT_REPEATS of the scale
    repeats: int | None = None
    #: untimed runs per query before the timed ones; None: DEFAULT_WARMUP of the scale
    warmup: int | None = None
    #: DuckDB threads; None: the job's CPUs (hopperlab.node.threads, set by the runner), else
    #: all of the node's cores
    duckdb_threads: int | None = None
    #: pinned host->device GB/s of the node for link_fraction; None: measured at the start
    link_gbps: float | None = None

    def __post_init__(self) -> None:
        queries = tuple(self.queries)
        object.__setattr__(self, "queries", queries)
        if not queries:
            raise ValueError("queries: expected at least one of " + ", ".join(QUERIES))
        for q in queries:
            if q not in QUERIES:
                raise ValueError(f"queries: unknown query {q!r}; expected some of "
                                 f"{', '.join(QUERIES)}")
        if len(set(queries)) != len(queries):
            raise ValueError(f"queries: each query at most once, got {list(queries)}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement: expected one of {', '.join(PLACEMENTS)}, got "
                             f"{self.placement!r}")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding: expected one of {', '.join(ENCODINGS)}, got "
                             f"{self.encoding!r}")
        for name in ("prefetch", "fused_kernels"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected true or false, got {getattr(self, name)!r}")
        for name, low in (("chunk_rows", 1), ("repeats", 1), ("warmup", 0),
                          ("duckdb_threads", 1)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < low):
                raise ValueError(f"{name}: expected a whole number >= {low}, got {value!r}")
        if self.link_gbps is not None and not (isinstance(self.link_gbps, (int, float))
                                               and self.link_gbps > 0):
            raise ValueError(f"link_gbps: expected a positive number, got {self.link_gbps!r}")


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
                       work_label="queries per joule"),
              WorkUnit("cost_per_tb_scanned", "per TB scanned", 1e12, "sum_per_ms",
                       "_bytes_read", time_suffix="_time_ms", work_per_j="gb_scanned_per_j",
                       work_label="GB scanned per joule", work_scale=1e9),
              # the DuckDB peer on the host's cores, in its own energy window (energy only)
              WorkUnit("cost_per_1k_duckdb_queries", "per 1000 DuckDB queries", 1e3,
                       "count_per_ms", time_suffix="_duckdb_ms",
                       work_per_j="duckdb_queries_per_j", work_label="DuckDB queries per joule",
                       window="duckdb"))
FLOORS = {f"{q}_time_ms": f"{q}_floor_ms" for q in QUERIES}

FAMILY = FamilyInfo(
    name="database",
    entry="hopperlab.workloads.database.workload:run",
    predict="hopperlab.workloads.database.predict:MODEL",
    supported_knobs={
        "memory": frozenset({"device", "managed", "system"}),
        "profiler": PROFILERS,
    },
    params=DatabaseParams,
    headline_metrics=HEADLINE_METRICS,
    charts="hopperlab.workloads.database.charts:charts",
    directions=METRIC_DIRECTIONS,
    work_units=WORK_UNITS,
    floors=FLOORS,
    check=check,
    # loading the tables and the DuckDB answers take most of a run: windows of the queries
    repeat_unit="windows",
)
