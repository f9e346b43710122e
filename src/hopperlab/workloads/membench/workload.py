"""membench's entry: ``run(spec, recorder)``; the measurements are in ``copies``, ``allocation``
and ``collective``.

With a CUDA device everything runs on it (``membench.target=cuda``); without one the host
measurements run (``membench.target=host``) and the rest is skipped with the reason. Knobs:
``memory`` (device | managed buffers) and ``profiler`` (the sweep is the measured region, an
NVTX range per size). What runs where, in detail: docs/benchmarks/membench.md.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator

from hopperlab.core.energy_names import TAG_WORK_NOT_COUNTED
from hopperlab.workloads.base import Recording, RunView, spec_params
from hopperlab.cuda.nvtx import nvtx_range, profiled_region
from hopperlab.core.rundir import SkipRun
from hopperlab.core.window import MEASURED, window
from hopperlab.workloads.membench import HEADLINE_METRICS, MembenchParams, headline_metrics
from hopperlab.workloads.membench import collective, matmul
from hopperlab.workloads.membench.allocation import check_alloc, run_alloc
from hopperlab.workloads.membench.common import Env, plan_for, probe
from hopperlab.workloads.membench.copies import check_copy, run_copy

__all__ = ["run", "HEADLINE_METRICS", "headline_metrics"]

#: why a test other than copy counts no bytes copied inside its window (tag
#: ``energy.work_not_counted``; the J per unit is then by the rate, and says so)
_NOT_COUNTED = {
    "alloc": "the alloc test copies nothing over the host link: its window holds allocations, "
             "first touches and frees, which no unit of work of the family counts",
    "collective": "the collective test moves bytes between GPUs, not over the host link: no "
                  "unit of work of the family counts bus bytes",
}




def run(spec: RunView, recorder: Recording, *, use_torch: bool = True) -> None:
    """Measure the variant ``spec`` describes and record it (see the module docstring).

    ``use_torch=False`` behaves as on a node without torch (tests of the numpy path).
    """
    params = spec_params(spec, MembenchParams)
    memory = spec.knobs.memory
    profiler = spec.knobs.profiler
    allow_over = spec.site.allow_oversubscription
    plan = plan_for(params)

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
    if params.test == "matmul":  # the node's ceilings: counts its own work (TFLOP)
        matmul.check_matmul(env, params)  # skip before the profiler starts
        with _profiling(env, profiler, recorder):
            matmul.run_matmul(env, params, recorder)
        return
    if params.test != "copy":  # the unit of work is bytes copied over the host link
        recorder.set_tag(TAG_WORK_NOT_COUNTED, _NOT_COUNTED[params.test])
    if params.test == "collective":
        collective.check(params)  # skip before the profiler starts
        with _profiling(env, profiler, recorder) as mark:
            collective.run_collective(params, recorder, mark)
        return
    check, measure = (check_copy, run_copy) if params.test == "copy" else (check_alloc, run_alloc)
    check(env, params, memory)  # skip before the profiler starts
    if profiler == "torch" and env.torch is None:
        raise SkipRun("profiler=torch needs torch, which is not installed")

    with _profiling(env, profiler, recorder) as mark:
        measure(env, params, plan, recorder, mark=mark, memory=memory,
                allow_oversubscription=allow_over)


@contextmanager
def _profiling(env: Env, profiler: str, recorder: Recording) -> Iterator[Callable[[str], Any]]:
    """Yield ``mark(name)``: a context manager around one size's measurement (an NVTX range and a
    torch ``record_function`` where torch is, nothing otherwise), inside the measured region.

    Without torch the measured window is opened all the same (no device to synchronise): the
    energy meter then reads the sweep whose bytes ``measured_gb_copied`` counts, not the whole
    workload call (issue 36: the window's joules over the work done inside it)."""
    recorder.set_tag("membench.profiler", profiler)
    if env.torch is None:
        with window(MEASURED):
            yield lambda name: nullcontext()
        return
    with profiled_region(profiler, recorder):
        yield nvtx_range
