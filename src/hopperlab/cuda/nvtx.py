"""NVTX ranges and the profiler capture window, named the same in every family.

Workloads mark their work with ``nvtx_range(name)`` so that an Nsight Systems timeline, the
``nvtx_sum`` report and the torch profiler all show the same names across families:

==========================  =========================================================
``step``                    one measured (or warm-up) iteration of a training loop
``forward`` / ``backward``  the model's passes; ``optimizer`` the optimizer step
``data.wait``               the loop waiting for its data loader
``offload.copy``            device -> host copies of an offload technique
``offload.prefetch``        host -> device copies ahead of use
``pipeline.<component>``    one component of a latency pipeline (recommender, inference)
``query.<operator>``        one operator of a query plan (database)
==========================  =========================================================

``measured_region()`` opens the capture around the measured steps (``cudaProfilerStart`` /
``Stop``), which ``nsys profile --capture-range=cudaProfilerApi`` waits for. Without CUDA, or
without torch, every helper here is a no-op, so workloads call them unconditionally.

``profiled_region(profiler, recorder)`` is ``measured_region()`` plus, for ``profiler: torch``,
the torch profiler over the same steps, its Chrome trace saved as ``TORCH_TRACE`` under the run's
artifacts (where ``hopperlab.profiling`` reads it into ``prof_`` metrics).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, ContextManager, Iterator

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
    work does not leak into the capture and the last step's kernels are inside it.
    """
    torch = _torch()
    if not (torch is not None and torch.cuda.is_available()):
        yield
        return
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    try:
        yield
    finally:
        torch.cuda.synchronize()
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
