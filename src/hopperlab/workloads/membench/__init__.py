"""membench: what the host<->device memory system gives on the node a job landed on.

Three tests (``MembenchParams.test``):

* ``copy``: copy bandwidth host->device, device->host and both at once, from pageable or pinned
  host memory, over a sweep of sizes.
* ``alloc``: allocation cost and first-touch / migration bandwidth of one memory kind
  (cudaMalloc, pinned host, managed, plain host pages), or, with ``kind: system`` and the knob
  ``memory: system``, plain malloc/mmap memory read and written by GPU kernels directly (only
  where the device reports pageableMemoryAccess: Grace Hopper, x86 with HMM).
* ``collective``: the GPU-GPU link: all-reduce or all-gather over the run's ranks (NCCL on
  GPUs, gloo on CPU), time and nccl-tests' algorithm and bus bandwidth over message sizes, and
  the time of the hidden-size message of a 70B decode step (``collective.py``).

Units: sizes are MiB (``size_mb`` = 2**20 bytes, as CUDA's bandwidthTest counts); bandwidth is
GB/s with GB = 1e9 bytes; times are milliseconds. ``workload.py`` says how each figure is timed
and what runs on a node without a CUDA device.

This module is imported by the spec layer: it stays cheap (no torch, no numpy).
"""

from __future__ import annotations

from dataclasses import dataclass

from hopperlab.workloads.base import (HIGHER, LOWER, PROFILERS, Contradiction, FamilyInfo, Knobs,
                                      WorkUnit)

TESTS = ("copy", "alloc", "collective")
OPS = ("all_reduce", "all_gather")
DIRECTIONS = ("h2d", "d2h", "bidir")
HOST_MEMORIES = ("pageable", "pinned")
KINDS = ("device", "pinned", "managed", "host", "system")

#: Size sweeps (MiB) and repeat counts used when the params leave them unset.
DEFAULT_SIZES_MB = {"smoke": (1, 8, 32), "full": (1, 4, 16, 64, 256, 1024)}
DEFAULT_REPEATS = {"smoke": 3, "full": 20}
DEFAULT_WARMUP = {"smoke": 1, "full": 3}
#: collective: the largest message of the sweep (bytes), per scale, when max_bytes is unset
DEFAULT_MAX_BYTES = {"smoke": 1 << 20, "full": 1 << 30}

#: The figures the report charts for every membench run (each run logs the ones of its test).
#: gbps_peak / gbps_at_largest: copy GB/s (bidir: both directions' bytes) or, for alloc, the
#: first-touch GB/s of the kind; alloc_ms_at_largest: one allocation of the largest size.
#: collective: busbw_gbps_peak (nccl-tests' bus bandwidth, GB/s, the sweep's best),
#: latency_us_small (one call of the smallest message), latency_us_decode_b1 (one call of a 70B
#: decode step's hidden-size message at batch 1: 8192 x 2 bytes).
COLLECTIVE_HEADLINES = ("busbw_gbps_peak", "latency_us_small", "latency_us_decode_b1")
HEADLINE_METRICS: tuple[str, ...] = ("gbps_peak", "gbps_at_largest", "alloc_ms_at_largest",
                                     *COLLECTIVE_HEADLINES)


def headline_metrics(test: str) -> tuple[str, ...]:
    """The headline metrics a run of ``test`` records."""
    if test == "alloc":
        return ("gbps_peak", "gbps_at_largest", "alloc_ms_at_largest")
    if test == "collective":
        return COLLECTIVE_HEADLINES
    return ("gbps_peak", "gbps_at_largest")


@dataclass(frozen=True)
class MembenchParams:
    #: "copy" (copy bandwidth) or "alloc" (allocation cost and first touch / migration)
    test: str = "copy"
    #: copy: "h2d", "d2h" or "bidir" (one stream each way at once; counts both directions' bytes)
    direction: str = "h2d"
    #: copy: host side "pageable" (plain) or "pinned" (page-locked) memory
    host_memory: str = "pinned"
    #: alloc: "device" (cudaMalloc), "pinned" (cudaHostAlloc), "managed" (cudaMallocManaged),
    #: "host" (fresh anonymous pages, what malloc gives for a large block), "system" (such
    #: pages read and written by GPU kernels, first touch by CPU or GPU, cudaMemAdvise and
    #: cudaMemPrefetchAsync on them; with the knob memory: system)
    kind: str = "device"
    #: the sweep, MiB per buffer; empty: DEFAULT_SIZES_MB of the run's scale
    sizes_mb: tuple[int, ...] = ()
    #: timed samples per size (the median is reported); None: DEFAULT_REPEATS of the scale
    repeats: int | None = None
    #: untimed samples per size before the timed ones; None: DEFAULT_WARMUP of the scale
    #: (collective: ``repeats`` back-to-back timed calls per size after ``warmup`` untimed)
    warmup: int | None = None
    #: collective: "all_reduce" or "all_gather" (nccl-tests' sizes: all-gather's is the whole
    #: gathered output)
    op: str = "all_reduce"
    #: collective: the sweep's smallest and largest message, bytes (max None: the scale's
    #: DEFAULT_MAX_BYTES), each ``factor`` times the one before
    min_bytes: int = 8
    max_bytes: int | None = None
    factor: int = 2
    #: collective: replay the timed calls from one captured CUDA graph (NCCL only; what a
    #: graph-captured decode step pays, without Python's launch of each call)
    graph: bool = False
    #: collective: batches whose 70B decode message (decode_hidden x 2 bytes x batch) is timed
    decode_batches: tuple[int, ...] = (1, 8)
    decode_hidden: int = 8192

    def __post_init__(self) -> None:
        choices = {"test": TESTS, "direction": DIRECTIONS, "host_memory": HOST_MEMORIES,
                   "kind": KINDS, "op": OPS}
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
        sizes = tuple(self.sizes_mb)
        object.__setattr__(self, "sizes_mb", sizes)
        for s in sizes:
            if isinstance(s, bool) or not isinstance(s, int) or s <= 0:
                raise ValueError(f"sizes_mb: expected positive whole MiB, got {s!r}")
        if self.repeats is not None and (isinstance(self.repeats, bool) or self.repeats < 1):
            raise ValueError(f"repeats: expected at least 1, got {self.repeats!r}")
        if self.warmup is not None and (isinstance(self.warmup, bool) or self.warmup < 0):
            raise ValueError(f"warmup: expected 0 or more, got {self.warmup!r}")
        object.__setattr__(self, "decode_batches", tuple(self.decode_batches))
        whole = {"min_bytes": self.min_bytes, "factor": self.factor,
                 "decode_hidden": self.decode_hidden, **{f"decode_batches[{i}]": b for i, b in
                                                         enumerate(self.decode_batches)}}
        for name, value in whole.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive whole number, got {value!r}")
        if self.factor < 2:
            raise ValueError(f"factor: expected 2 or more, got {self.factor}")
        if self.max_bytes is not None and (isinstance(self.max_bytes, bool)
                                           or self.max_bytes < self.min_bytes):
            raise ValueError(f"max_bytes: expected at least min_bytes ({self.min_bytes}), "
                             f"got {self.max_bytes!r}")


def check(knobs: Knobs, params: MembenchParams) -> None:
    """Refuse a variant whose memory knob contradicts its test or kind (``FamilyInfo.check``)."""
    memory, kind = knobs.memory, params.kind
    if params.test == "collective" and memory != "device":
        raise Contradiction("memory", f"{memory!r} does not apply to the test collective (the "
                            f"collective's buffers are the backend's own)")
    if params.test == "copy" and memory == "system":
        raise Contradiction("memory", "system has no copy to measure (the GPU reads system "
                            "memory in place): use test: alloc, kind: system")
    if params.test != "alloc":
        return
    if memory == "managed" and kind != "managed":
        raise Contradiction("memory", f"managed contradicts kind: {kind} (use kind: managed, or "
                            f"memory: device)")
    if (memory == "system") != (kind == "system"):
        raise Contradiction("memory", f"{memory!r} with kind {kind!r}: kind: system goes with "
                            f"memory: system, and only with it")


#: which way each figure is better, and what a run's cost is divided by
METRIC_DIRECTIONS = {"gbps_peak": HIGHER, "gbps_at_largest": HIGHER, "h2d_gbps_at_largest": HIGHER,
              "d2h_gbps_at_largest": HIGHER, "alloc_ms_at_largest": LOWER,
              "free_ms_at_largest": LOWER, "busbw_gbps_peak": HIGHER,
              "busbw_gbps_at_largest": HIGHER, "latency_us_small": LOWER,
              "latency_us_decode_b1": LOWER, "latency_us_decode_b8": LOWER}
WORK_UNITS = (WorkUnit("cost_per_tb_copied", "per TB copied (at the largest size)", 1e12 / 1e9,
                       "per_s", "gbps_at_largest", work_per_j="gb_copied_per_j",
                       work_label="GB copied per joule"),)

FAMILY = FamilyInfo(
    name="membench",
    entry="hopperlab.workloads.membench.workload:run",
    predict="hopperlab.workloads.membench.predict:MODEL",
    supported_knobs={
        "memory": frozenset({"device", "managed", "system"}),
        "profiler": PROFILERS,
    },
    params=MembenchParams,
    headline_metrics=HEADLINE_METRICS,
    directions=METRIC_DIRECTIONS,
    work_units=WORK_UNITS,
    charts="hopperlab.workloads.membench.charts:charts",
    check=check,
)
