"""The collective test: the GPU-GPU link as distributed runs use it.

Over the run's ranks (NCCL on GPUs, gloo on CPU: the process group the runner set up), one
collective (``op``) over a sweep of message sizes, ``min_bytes`` to ``max_bytes`` by ``factor``,
each timed by ``hopperlab.cuda.collectives.time_collective`` (``repeats`` back-to-back calls
after ``warmup`` untimed; the slowest rank's mean) with nccl-tests' definitions: ``algbw = S/t``,
``busbw = algbw x 2(n-1)/n`` (all-reduce) or ``(n-1)/n`` (all-gather), S the message (all-gather:
the whole output). Then the hidden-size message of a 70B decode step (8192 x 2 bytes x batch),
the all-reduce term of a TP serving floor, and a correctness check. Every rank records the same
figures (rank 0's make the run's record).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from hopperlab.core.rundir import SkipRun
from hopperlab.cuda import collectives
from hopperlab.workloads.base import Recording
from hopperlab.workloads.membench import MembenchParams


def sizes(params: MembenchParams) -> list[int]:
    """The sweep: min_bytes, min_bytes x factor, ... up to max_bytes."""
    out, s = [], params.min_bytes
    while s <= params.max_bytes:
        out.append(s)
        s *= params.factor
    return out


def decode_message_bytes(hidden: int, batch: int) -> int:
    """A decode step's all-reduce message: one bf16 hidden vector per sequence of the batch."""
    return hidden * 2 * batch


def check(params: MembenchParams) -> Any:
    """The process group to measure over, or SkipRun saying why there is none here."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise SkipRun("the collective test needs a run of several tasks (resources: "
                      "tasks_per_node or gpus_per_node of 2 or more): no process group here")
    backend = str(dist.get_backend())
    if params.graph and "nccl" not in backend:
        raise SkipRun(f"graph: true captures NCCL calls in a CUDA graph; this run's process "
                      f"group is {backend} (no GPUs)")
    return dist


def run_collective(params: MembenchParams, recorder: Recording,
                   mark: Callable[[str], Any]) -> None:
    dist = check(params)
    op = params.op
    repeats, warmup = params.repeats, params.warmup
    n = dist.get_world_size()
    recorder.set_tag("membench.op", op)
    recorder.set_tag("membench.backend", str(dist.get_backend()))
    recorder.set_tag("membench.world_size", n)
    recorder.set_tag("membench.graph", str(params.graph).lower())
    recorder.set_tag("membench.bus_factor", f"{collectives.bus_factor(op, n):.4f}")
    rows = []
    for step, nbytes in enumerate(sizes(params)):
        with mark(f"{op} {nbytes} B"):
            t = collectives.time_collective(op, nbytes, repeats, warmup=warmup,
                                            graph=params.graph)
        row = {"size_bytes": float(t.nbytes), "time_us": t.seconds * 1e6,
               "algbw_gbps": t.algbw_gbps, "busbw_gbps": t.busbw_gbps}
        rows.append(row)
        recorder.log_step(step, **{k: v for k, v in row.items() if math.isfinite(v)})
        for name in ("time_us", "busbw_gbps"):
            if math.isfinite(row[name]):
                recorder.log_metric(f"{name}_{t.nbytes}b", row[name])
    _summary(recorder, rows)
    for batch in params.decode_batches:
        nbytes = decode_message_bytes(params.decode_hidden, batch)
        with mark(f"{op} decode message b{batch}"):
            t = collectives.time_collective(op, nbytes, repeats, warmup=warmup,
                                            graph=params.graph)
        recorder.log_metric(f"latency_us_decode_b{batch}", t.seconds * 1e6)
        recorder.set_tag(f"membench.decode_b{batch}_bytes", t.nbytes)
    probe = sizes(params)[-1]
    if not collectives.check_collective(op, probe):
        raise RuntimeError(f"{op} of {probe} B gave a wrong result on rank {dist.get_rank()}")
    recorder.log_metric("correct", 1.0)
    _write_csv(recorder, rows)


def _summary(recorder: Recording, rows: list[dict[str, float]]) -> None:
    if not rows:
        return
    bus = [r["busbw_gbps"] for r in rows if math.isfinite(r["busbw_gbps"])]
    if bus:
        recorder.log_metric("busbw_gbps_peak", max(bus))
    for name, value in (("busbw_gbps_at_largest", rows[-1]["busbw_gbps"]),
                        ("latency_us_small", rows[0]["time_us"]),
                        ("largest_size_bytes", rows[-1]["size_bytes"])):
        if math.isfinite(value):
            recorder.log_metric(name, value)


def _write_csv(recorder: Recording, rows: list[dict[str, float]]) -> None:
    cols = ("size_bytes", "time_us", "algbw_gbps", "busbw_gbps")
    lines = [",".join(cols)] + [",".join(f"{r[c]:.6g}" for c in cols) for r in rows]
    recorder.artifact_path("sweep.csv").write_text("\n".join(lines) + "\n")
