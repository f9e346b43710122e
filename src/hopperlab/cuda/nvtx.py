"""NVTX ranges and the profiler capture window, named the same in every family.

Workloads mark their work with ``nvtx_range(name)`` (the names are the constants here), open
the capture around the measured steps with ``measured_region()`` (``cudaProfilerStart``/
``Stop``, what ``nsys --capture-range=cudaProfilerApi`` waits for), or ``profiled_region(
profiler, recorder)`` to add the torch profiler over the same steps. Without CUDA or torch every
helper is a no-op, so workloads call them unconditionally. The table of names: docs/profiling.md.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, ContextManager, Iterator

from hopperlab.core.window import MEASURED, window

STEP = "step"
FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
DATA_WAIT = "data.wait"
OFFLOAD_COPY = "offload.copy"
OFFLOAD_PREFETCH = "offload.prefetch"
#: the torch profiler's Chrome trace, relative to the run's artifacts/
TORCH_TRACE = "profile/torch_trace.json"


def pipeline(component: str) -> str:
    return f"pipeline.{component}"


def query_operator(operator: str) -> str:
    return f"query.{operator}"


def _torch() -> Any | None:
    try:
        import torch
    except ImportError:
        return None
    return torch


def nvtx_range(name: str) -> ContextManager[Any]:
    """An NVTX range (CUDA) that is also a ``record_function`` for the torch profiler."""
    torch = _torch()
    if torch is None:
        return nullcontext()
    return _both(torch, name)


@contextmanager
def _both(torch: Any, name: str) -> Iterator[None]:
    pushed = False
    if torch.cuda.is_available():
        torch.cuda.nvtx.range_push(name)
        pushed = True
    try:
        with torch.profiler.record_function(name):
            yield
    finally:
        if pushed:
            torch.cuda.nvtx.range_pop()


@contextmanager
def measured_region() -> Iterator[None]:
    """Open the profiler capture (cudaProfilerStart) for the measured steps, close it after.

    Under ``nsys profile --capture-range=cudaProfilerApi`` only what runs inside is recorded;
    outside nsys the calls cost nothing. The GPU is synchronised at both ends so that warm-up
    work does not leak into the capture and the last step's kernels are inside it. Inside the
    synchronisations it is also the measured window (``core.window``): the energy meter reads
    its counters there.
    """
    torch = _torch()
    if not (torch is not None and torch.cuda.is_available()):
        with window(MEASURED):
            yield
        return
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    try:
        with window(MEASURED):
            try:
                yield
            finally:
                torch.cuda.synchronize()
    finally:
        torch.cuda.profiler.stop()


@contextmanager
def profiled_region(profiler: str, recorder: Any) -> Iterator[None]:
    """``measured_region()``; with ``profiler == "torch"`` also the torch profiler (CPU, and
    CUDA where available) over it, saved to ``recorder.artifact_path(TORCH_TRACE)``."""
    if profiler != "torch":
        with measured_region():
            yield
        return
    torch = _torch()
    if torch is None:
        raise RuntimeError("profiler=torch needs torch, which is not installed")
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        with measured_region():
            yield
    prof.export_chrome_trace(str(recorder.artifact_path(TORCH_TRACE)))
