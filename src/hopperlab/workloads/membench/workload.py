"""membench's entry: ``run(spec, recorder)``; the measurements are in ``copies`` and ``allocation``.

What runs where:

* On a node where torch sees a CUDA device and the spec asks for a GPU: everything, on the
  current device (tag ``membench.target=cuda``).
* On a node without one (no torch, a CPU build, no visible device, or ``resources.gpus: 0``):
  host measurements that stand for what the node *can* do, tagged ``membench.target=host``, and
  a ``SkipRun`` naming what is missing for the rest. Concretely:
  - ``copy`` with pageable host memory measures host memcpy between two host buffers (two at
    once in two threads for ``bidir``), metric prefix ``memcpy`` / ``memcpy_x2`` (never ``h2d``:
    no device is involved); ``copy`` with pinned memory is skipped.
  - ``alloc`` of kind ``host`` runs (it never needs a GPU); ``device``, ``pinned`` and
    ``managed`` are skipped.
  This way the smoke matrix on a CPU machine measures something real in 4 of its 10 variants
  and says plainly why the other 6 did not run.
* Host-side work (memcpy, CPU writes and reads) is numpy in one thread, with or without torch
  (tag ``membench.host_backend``; ``common.HostBackend`` says why not torch's threaded CPU ops).

Knobs: ``memory`` (device | managed): for ``copy``, where the device buffers come from
(cudaMalloc, or cudaMallocManaged prefetched to the GPU); for ``alloc``, ``managed`` goes with
``kind: managed`` only. ``profiler``: the sweep is the measured region
(``hopperlab.cuda.nvtx.profiled_region``: the nsys capture under ``profiler: nsys``, the torch
profiler and ``artifacts/profile/torch_trace.json`` under ``profiler: torch``), with an NVTX range
(and torch ``record_function``) around each size.

Managed memory never takes more than half of the GPU's free memory unless the node is Grace
Hopper or the site sets ``allow_oversubscription: true`` (``managed_bytes_allowed``); otherwise
the variant is skipped before anything is allocated.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator

from hopperlab.workloads.base import spec_knob, spec_params
from hopperlab.cuda.nvtx import nvtx_range, profiled_region
from hopperlab.core.rundir import SkipRun
from hopperlab.workloads.membench import HEADLINE_METRICS, MembenchParams, headline_metrics
from hopperlab.workloads.membench.allocation import check_alloc, run_alloc
from hopperlab.workloads.membench.common import Env, plan_for, probe
from hopperlab.workloads.membench.copies import check_copy, run_copy

__all__ = ["run", "HEADLINE_METRICS", "headline_metrics"]




def run(spec: Any, recorder: Any, *, use_torch: bool = True) -> None:
    """Measure the variant ``spec`` describes and record it (see the module docstring).

    ``use_torch=False`` behaves as on a node without torch (tests of the numpy path).
    """
    params = spec_params(spec, MembenchParams)
    scale = str(getattr(spec, "scale", "smoke") or "smoke")
    memory = str(spec_knob(spec, "memory", "device"))
    profiler = str(spec_knob(spec, "profiler", "none"))
    allow_over = bool(getattr(getattr(spec, "site", None), "allow_oversubscription", False))
    plan = plan_for(params, scale)

    env = probe(spec, use_torch=use_torch)
    recorder.set_tag("membench.test", params.test)
    recorder.set_tag("membench.target", env.target)
    recorder.set_tag("membench.host_backend", env.host.name)
    recorder.set_tag("membench.sizes_mb", ",".join(map(str, plan.sizes_mb)))
    recorder.set_tag("membench.repeats", plan.repeats)
    recorder.set_tag("membench.warmup", plan.warmup)
    if env.target == "cuda":
        recorder.set_tag("membench.gpu", env.gpu_name)
        recorder.set_tag("membench.device", env.device)
        recorder.set_tag("membench.grace_hopper", str(env.is_grace_hopper).lower())
    else:
        recorder.set_tag("membench.no_cuda_reason", env.no_cuda_reason)
    check, measure = (check_copy, run_copy) if params.test == "copy" else (check_alloc, run_alloc)
    check(env, params, memory)  # skip before the profiler starts
    if profiler == "torch" and env.torch is None:
        raise SkipRun("profiler=torch needs torch, which is not installed")

    with _profiling(env, profiler, recorder) as mark:
        measure(env, params, plan, recorder, mark=mark, memory=memory,
                allow_oversubscription=allow_over)


@contextmanager
def _profiling(env: Env, profiler: str, recorder: Any) -> Iterator[Callable[[str], Any]]:
    """Yield ``mark(name)``: a context manager around one size's measurement (an NVTX range and a
    torch ``record_function`` where torch is, nothing otherwise), inside the measured region."""
    recorder.set_tag("membench.profiler", profiler)
    if env.torch is None:
        yield lambda name: nullcontext()
        return
    with profiled_region(profiler, recorder):
        yield nvtx_range
