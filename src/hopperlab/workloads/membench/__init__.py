"""membench: what the host<->device memory system gives on the node a job landed on.

Four tests (``MembenchParams.test``):

* ``copy``: copy bandwidth host->device, device->host and both at once, from pageable or pinned
  host memory, over a sweep of sizes.
* ``alloc``: allocation cost and first-touch / migration bandwidth of one memory kind
  (cudaMalloc, pinned host, managed, plain host pages), or, with ``kind: system`` and the knob
  ``memory: system``, plain malloc/mmap memory read and written by GPU kernels directly (only
  where the device reports pageableMemoryAccess: Grace Hopper, x86 with HMM).
* ``collective``: the GPU-GPU link: all-reduce or all-gather over the run's ranks (NCCL on
  GPUs, gloo on CPU), time and nccl-tests' algorithm and bus bandwidth over message sizes, and
  the time of the hidden-size message of a 70B decode step (``collective.py``).
* ``matmul``: the node's own ceilings, a bf16 or fp8 matmul loop on one GPU (``matmul.py``):
  TFLOP/s (the compute floor) and TFLOP per joule (the energy plausibility gate's ceiling);
  GPU-only, skipped with the reason elsewhere.

Units: sizes are MiB (``size_mb`` = 2**20 bytes, as CUDA's bandwidthTest counts); bandwidth is
GB/s with GB = 1e9 bytes; times are milliseconds. ``workload.py`` says how each figure is timed
and what runs on a node without a CUDA device.

This module is imported by the spec layer: it stays cheap (no torch, no numpy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from hopperlab.core.schema import bounded, settle_fields
from hopperlab.workloads.base import (HIGHER, LOWER, PROFILERS, Contradiction, FamilyInfo, Knobs,
                                      WorkUnit)

# each choice declared once, as the params' type (core.schema checks it); the tuples for readers
Test = Literal["copy", "alloc", "collective", "matmul"]
Dtype = Literal["bf16", "fp8"]
Op = Literal["all_reduce", "all_gather"]
Direction = Literal["h2d", "d2h", "bidir"]
HostMemory = Literal["pageable", "pinned"]
Kind = Literal["device", "pinned", "managed", "host", "system"]
TESTS, OPS, DIRECTIONS = get_args(Test), get_args(Op), get_args(Direction)
HOST_MEMORIES, KINDS = get_args(HostMemory), get_args(Kind)

#: The figures the report charts for every membench run (each run logs the ones of its test).
#: gbps_peak / gbps_at_largest: copy GB/s (bidir: both directions' bytes) or, for alloc, the
#: first-touch GB/s of the kind; alloc_ms_at_largest: one allocation of the largest size.
#: collective: busbw_gbps_peak (nccl-tests' bus bandwidth, GB/s, the sweep's best),
#: latency_us_small (one call of the smallest message), latency_us_decode_b1 (one call of a 70B
#: decode step's hidden-size message at batch 1: 8192 x 2 bytes).
COLLECTIVE_HEADLINES = ("busbw_gbps_peak", "latency_us_small", "latency_us_decode_b1")
#: matmul: tflops (the loop's TFLOP/s), tflop_per_j (its TFLOP per GPU joule)
MATMUL_HEADLINES = ("tflops", "tflop_per_j")
HEADLINE_METRICS: tuple[str, ...] = ("gbps_peak", "gbps_at_largest", "alloc_ms_at_largest",
                                     *COLLECTIVE_HEADLINES, *MATMUL_HEADLINES)


def headline_metrics(test: str) -> tuple[str, ...]:
    """The headline metrics a run of ``test`` records."""
    if test == "alloc":
        return ("gbps_peak", "gbps_at_largest", "alloc_ms_at_largest")
    if test == "collective":
        return COLLECTIVE_HEADLINES
    if test == "matmul":
        return MATMUL_HEADLINES
    return ("gbps_peak", "gbps_at_largest")


@dataclass(frozen=True)
class MembenchParams:
    #: "copy" (copy bandwidth) or "alloc" (allocation cost and first touch / migration)
    test: Test = "copy"
    #: copy: "h2d", "d2h" or "bidir" (one stream each way at once; counts both directions' bytes)
    direction: Direction = "h2d"
    #: copy: host side "pageable" (plain) or "pinned" (page-locked) memory
    host_memory: HostMemory = "pinned"
    #: alloc: "device" (cudaMalloc), "pinned" (cudaHostAlloc), "managed" (cudaMallocManaged),
    #: "host" (fresh anonymous pages, what malloc gives for a large block), "system" (such
    #: pages read and written by GPU kernels, first touch by CPU or GPU, cudaMemAdvise and
    #: cudaMemPrefetchAsync on them; with the knob memory: system)
    kind: Kind = "device"
    # the sizes and counts below are the smoke scale's; experiments/membench.yaml's ``scales:``
    # sets each scale's (the workload reads params only, never the scale's name)
    #: the sweep, MiB per buffer
    sizes_mb: tuple[int, ...] = bounded((1, 8, 32), at_least=1, min_len=1)
    #: timed samples per size (the median is reported)
    repeats: int = bounded(3, at_least=1)
    #: untimed samples per size before the timed ones
    #: (collective: ``repeats`` back-to-back timed calls per size after ``warmup`` untimed)
    warmup: int = bounded(1, at_least=0)
    #: copy: MiB one timed sample moves at least (a small size repeats its copy inside a
    #: sample, up to 256 times)
    sample_mb: int = bounded(16, at_least=1)
    #: collective: "all_reduce" or "all_gather" (nccl-tests' sizes: all-gather's is the whole
    #: gathered output)
    op: Op = "all_reduce"
    #: collective: the sweep's smallest and largest message, bytes, each ``factor`` times the
    #: one before
    min_bytes: int = bounded(8, at_least=1)
    max_bytes: int = bounded(1 << 20, at_least=1)
    factor: int = bounded(2, at_least=2)
    #: collective: replay the timed calls from one captured CUDA graph (NCCL only; what a
    #: graph-captured decode step pays, without Python's launch of each call)
    graph: bool = False
    #: collective: batches whose 70B decode message (decode_hidden x 2 bytes x batch) is timed
    decode_batches: tuple[int, ...] = bounded((1, 8), at_least=1)
    decode_hidden: int = bounded(8192, at_least=1)
    #: matmul: the inputs' type (fp8: e4m3 through torch._scaled_mm, the ceiling of fp8 runs),
    #: the square matrices' side and the seconds of the measured loop
    dtype: Dtype = "bf16"
    size: int = bounded(8192, at_least=16)
    seconds: float = bounded(3.0, at_least=0.1)

    def __post_init__(self) -> None:
        """Types and bounds are declared on the fields (``settle_fields``); here: the fields
        that go together."""
        settle_fields(self)
        if self.max_bytes < self.min_bytes:
            raise ValueError(f"max_bytes: expected at least min_bytes ({self.min_bytes}), "
                             f"got {self.max_bytes!r}")


def check(knobs: Knobs, params: MembenchParams) -> None:
    """Refuse a variant whose memory knob contradicts its test or kind (``FamilyInfo.check``)."""
    memory, kind = knobs.memory, params.kind
    if params.test in ("collective", "matmul") and memory != "device":
        raise Contradiction("memory", f"{memory!r} does not apply to the test {params.test} "
                            f"(its buffers are plain device memory)")
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
              "latency_us_decode_b1": LOWER, "latency_us_decode_b8": LOWER,
              "tflops": HIGHER, "tflop_per_j": HIGHER}
#: cost by the rate at the largest size; energy by the bytes every copy of the sweep moved
#: inside the measured window (``measured_gb_copied``, GB; issue 36). The alloc and collective
#: tests copy nothing over the host link and count none: their J per unit is by the rate, and
#: tag ``energy.work_not_counted`` says why (``workload._NOT_COUNTED``)
WORK_UNITS = (WorkUnit("cost_per_tb_copied", "per TB copied (at the largest size)", 1e12 / 1e9,
                       "per_s", "gbps_at_largest", work_per_j="gb_copied_per_j",
                       work_label="GB copied per joule", done=("measured_gb_copied",)),
              # matmul: the TFLOP the measured loop did (its TFLOP per joule: the ceiling)
              WorkUnit("cost_per_pflop", "per PFLOP", 1e3, "per_s", "tflops",
                       work_per_j="tflop_per_j", work_label="TFLOP per joule",
                       done=("measured_tflop",)))

FAMILY = FamilyInfo(
    name="membench",
    entry="hopperlab.workloads.membench.workload:run",
    sameness="hopperlab.workloads.membench.sameness:rule",
    predict="hopperlab.workloads.membench.predict:MODEL",
    supported_knobs={
        "memory": frozenset({"device", "managed", "system"}),
        "profiler": PROFILERS,
    },
    params=MembenchParams,
    headline_metrics=HEADLINE_METRICS,
    directions=METRIC_DIRECTIONS,
    judged=("gbps_at_largest", "busbw_gbps_peak", "latency_us_small", "alloc_ms_at_largest",
            "tflops"),
    work_units=WORK_UNITS,
    charts="hopperlab.workloads.membench.charts:charts",
    check=check,
)
