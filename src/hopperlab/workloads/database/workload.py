"""database's entry: ``run(spec, recorder)``.

Load the columns the queries read from the ``tables`` asset, run the query text in DuckDB (the
oracle and the peer), place the columns and time each plan, check every answer; a wrong answer
fails the run (``AnswerMismatch``) after everything is recorded. With a CUDA device the plans
run on the GPU, otherwise on the CPU (``database.target=cpu``; ``managed`` is skipped). Knobs
and what runs where: docs/benchmarks/database.md.
"""

from __future__ import annotations

import json
import platform
from contextlib import contextmanager
from typing import Any, Iterator

from hopperlab.core.rundir import SkipRun
from hopperlab.core.stats import GB, MIB
from hopperlab.core.window import window
from hopperlab.cuda.link import pinned_copy_gbps
from hopperlab.cuda.managed_policy import managed_bytes_allowed
from hopperlab.cuda.nvtx import measured_region
from hopperlab.cuda.runtime import CudaError, CudaRuntime
from hopperlab.cuda.system_memory import system_memory_support, system_memory_tags
from hopperlab.node import hardware
from hopperlab.node.threads import DUCKDB_ENV, env_threads
from hopperlab.workloads.base import Recording, RunView, no_cuda_reason, spec_params
from hopperlab.workloads.database import DatabaseParams
from hopperlab.workloads.database.columns import load_tables
from hopperlab.workloads.database.encoding import encode
from hopperlab.workloads.database.engine import HOST_RESIDENT, QueryFigures, run_query
from hopperlab.workloads.database.oracle import AnswerMismatch, DuckPeer, compare
from hopperlab.workloads.database.placement import make_source
from hopperlab.workloads.database.plans import needs_of
from hopperlab.workloads.database.sql import SQL


#: the energy window of the DuckDB peer's timed queries (its figures: ``duckdb_energy_*``)
DUCKDB_WINDOW = "duckdb"
#: the queries the DuckDB peer executed inside its window (``WorkUnit.done`` of its unit)
DUCKDB_MEASURED_QUERIES = "duckdb_measured_queries"


def check_system_memory(device: Any, recorder: Recording) -> None:
    """SkipRun (recorded) unless the GPU can read pageable host memory; before any table loads."""
    try:
        runtime = CudaRuntime()
    except CudaError as exc:
        raise SkipRun(f"placement system needs the CUDA runtime library: {exc}") from None
    support = system_memory_support(runtime, device.index or 0)
    for k, v in system_memory_tags(support).items():
        recorder.set_tag(k, v)
    if support.reason is not None:
        raise SkipRun(f"placement system: {support.reason}")


def compute_device(spec: RunView) -> tuple[Any, str | None]:
    """(torch device, None) for a usable GPU, or (cpu device, why not)."""
    import torch

    reason = no_cuda_reason(torch, spec.resources.gpus)
    if reason is None:
        return torch.device("cuda", torch.cuda.current_device()), None
    return torch.device("cpu"), reason


def managed_runtime(device: Any, need: int, allow_oversubscription: bool) -> Any:
    """The CUDA runtime binding for managed memory, after the free-memory rule allowed ``need``."""
    import torch

    try:
        runtime = CudaRuntime()
    except CudaError as exc:
        raise SkipRun(f"placement managed needs the CUDA runtime library: {exc}") from None
    free, _ = torch.cuda.mem_get_info(device)
    name = torch.cuda.get_device_name(device)
    cap = tuple(torch.cuda.get_device_capability(device))
    grace = hardware.is_grace_hopper(platform.machine(), name, cap)
    if not managed_bytes_allowed(need, free, grace, allow_oversubscription):
        raise SkipRun(f"managed memory: {need / GB:.2f} GB of columns, but at most half of the "
                      f"GPU's free memory ({free / GB:.2f} GB) may be managed on a node that is "
                      f"not Grace Hopper unless the site sets allow_oversubscription: true")
    return runtime


def run(spec: RunView, recorder: Recording) -> None:
    import torch

    params = spec_params(spec, DatabaseParams)
    profiler = spec.knobs.profiler
    device, no_gpu = compute_device(spec)
    recorder.set_tag("database.placement", params.placement)
    recorder.set_tag("database.encoding", params.encoding)
    recorder.set_tag("database.queries", ",".join(params.queries))
    recorder.set_tag("database.chunk_rows", params.chunk_rows)
    recorder.set_tag("database.repeats", params.repeats)
    recorder.set_tag("database.warmup", params.warmup)
    recorder.set_tag("database.target", device.type)
    if no_gpu:
        recorder.set_tag("database.no_gpu_reason", no_gpu)
        if params.placement in ("managed", "system"):
            raise SkipRun(f"placement {params.placement} needs a CUDA device: {no_gpu}")
    else:
        recorder.set_tag("database.gpu", torch.cuda.get_device_name(device))
        if params.placement == "system":
            check_system_memory(device, recorder)
    if params.placement == "managed":
        recorder.set_tag("database.prefetch", str(params.prefetch).lower())

    folder = spec.asset_path("tables")
    recorder.set_tag("database.tables", str(folder))
    needs = needs_of(params.queries)
    tables = load_tables(folder, needs)
    recorder.set_tag("database.lineitem_rows", tables["lineitem"].rows
                     if "lineitem" in tables else 0)

    peer = DuckPeer(folder, needs, params.duckdb_threads or env_threads(DUCKDB_ENV))
    recorder.set_tag("database.duckdb", f"duckdb {peer.version}, {peer.threads} threads")
    expected: dict[str, list[tuple]] = {}
    duck_ms: dict[str, float] = {}
    before = peer.executed
    with window(DUCKDB_WINDOW):  # its own energy window: the same queries on the host's cores
        for q in params.queries:
            rows, times = peer.timed(SQL[q], params.warmup, params.repeats)
            expected[q] = rows
            duck_ms[q] = sorted(times)[len(times) // 2]
    # every query the peer executed inside its window, warm-ups too: its joules over them
    recorder.log_metric(DUCKDB_MEASURED_QUERIES, float(peer.executed - before))
    peer.close()

    link = params.link_gbps
    if link is None and not no_gpu:
        link = pinned_copy_gbps(device, "h2d", 256 * MIB, copies=4, samples=3, verify=True)
        recorder.set_tag("database.link_source", "measured: pinned H2D, 256 MiB x 4, median of 3")
    elif link is not None:
        recorder.set_tag("database.link_source", "params.link_gbps")
    if link:
        recorder.log_metric("link_gbps", link)

    runtime = None
    if params.placement == "managed":
        need = sum(encode(c, params.encoding).data.nbytes for t in tables.values()
                   for c in t.columns.values())
        allow = spec.site.allow_oversubscription
        runtime = managed_runtime(device, need, allow)
    source = make_source(params.placement, tables, params.encoding, device, params.chunk_rows,
                         runtime=runtime, prefetch=params.prefetch,
                         fused=None if params.fused_kernels else False)
    recorder.set_tag("database.fused_kernels", str(source.fused).lower())
    recorder.log_metric("stored_bytes", source.stored_bytes())

    answers: dict[str, Any] = {}
    failures: list[str] = []
    # each plan's first call before the measured (energy) window: it compiles the fused kernels
    # and fills the allocator, work that is no query's (2026-11-28, lent H200, SF 10: about
    # 0.8 s of the 1.1 s window of 72 device queries, whose own time was 0.28 s)
    for q in params.queries:
        run_query(source, q, 1, 0)
    windows = spec.repeats
    step = 0
    executed, scanned = 0, 0  # inside the measured window, warm-ups included: J per unit
    try:
        with _profiling(profiler, device, recorder):
            for w in range(windows):  # repeat_unit "windows": each after its warm-up
                recorder.repeat = w if windows > 1 else None
                figures_w: dict[str, float] = {}
                for qi, q in enumerate(params.queries):
                    def sample(i: int, ms: float, qi: int = qi) -> None:
                        nonlocal step
                        recorder.log_step(step, query_index=qi, repeat=i, time_ms=ms)
                        step += 1

                    result = run_query(source, q, params.warmup, params.repeats, sample)
                    executed += params.warmup + params.repeats
                    scanned += (params.warmup + params.repeats) * result.bytes_read
                    diffs = compare(expected[q], result.rows)
                    figures = QueryFigures(q, result.time_ms, result.bytes_read, duck_ms[q],
                                           correct=not diffs,
                                           link_gbps=link if not no_gpu else None,
                                           host_resident=params.placement in HOST_RESIDENT)
                    recorder.log_metrics(figures.metrics())
                    figures_w.update(figures.metrics())
                    answers[q] = {"correct": not diffs, "differences": diffs,
                                  "duckdb": [list(map(str, r)) for r in expected[q]],
                                  "plan": [list(map(str, r)) for r in result.rows]}
                    if diffs:
                        failures.append(f"{q}: " + "; ".join(diffs))
                if windows > 1:
                    recorder.add_sample(figures_w)
            recorder.repeat = None
    finally:
        source.close()
    recorder.log_metric("all_correct", 0.0 if failures else 1.0)
    recorder.log_metrics({"measured_queries": float(executed),
                          "measured_bytes_scanned": float(scanned)})
    with open(recorder.artifact_path("answers.json"), "w") as fh:
        json.dump(answers, fh, indent=1)
    if failures:
        raise AnswerMismatch("answers differ from DuckDB's: " + " | ".join(failures))


@contextmanager
def _profiling(profiler: str, device: Any, recorder: Recording) -> Iterator[None]:
    recorder.set_tag("database.profiler", profiler)
    if profiler == "torch":
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        with profile(activities=activities) as prof, measured_region():
            yield
        prof.export_chrome_trace(str(recorder.artifact_path("profile/torch_trace.json")))
        return
    with measured_region():  # the capture under nsys; the energy window always
        yield
