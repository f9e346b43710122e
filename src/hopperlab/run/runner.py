"""What runs inside the job: fingerprint the node, run the workload, write the record.

Never talks to the network. Outcomes are data: running out of memory is ``status: oom`` (a
result); a bug is ``status: failed`` with ``traceback.txt``, and the exception still propagates so
that the scheduler and submitit see a failed job.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any

from hopperlab.config.spec import RunSpec
from hopperlab.core import energy_names as N
from hopperlab.core import rundir as record
from hopperlab.core.quiet import silence_known_noise
from hopperlab.core.rundir import (
    Recorder,
    SkipRun,
    read_json,
    write_json_atomic,
    write_text_atomic,
)
from hopperlab.core.window import errors as window_errors
from hopperlab.core.window import listening
from hopperlab.node import hardware, threads
from hopperlab.node.containers import inside_container
from hopperlab.node.energy.meter import EnergyMeter, Result, open_meter
from hopperlab.run import distributed, repeats
from hopperlab.run.warm_client import COLD_ENV, FORKED_ENV
from hopperlab.workloads import family_info


def _is_oom(exc: BaseException) -> bool:
    """Whether the run ran out of memory: host (MemoryError) or GPU (torch's OutOfMemoryError,
    checked by type when the workload has loaded torch; the runner never imports it itself)."""
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom_type = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    if isinstance(oom_type, type) and isinstance(exc, oom_type):
        return True
    text = str(exc)
    return "CUDA out of memory" in text or "cudaErrorMemoryAllocation" in text


def _size_threads(spec: RunSpec, rec: Recorder) -> None:
    """Size the thread pools from the CPUs this job was given (node.threads), before the
    workload imports anything that starts a pool; the plan goes into the hardware record."""
    overrides = dict(getattr(spec.resources, "threads", None) or {})
    omp = str(spec.site.env.get("OMP_NUM_THREADS", ""))
    if omp.isdigit() and int(omp) > 0:  # the site's env sizes the intra-op pool
        overrides.setdefault("intra_op", int(omp))
    here = distributed.task_from_env()  # the CPUs the scheduler gave, if it says
    given = (here.cpus, here.cpus_source) if here.cpus is not None else None
    plan = threads.job_threads(overrides, requested=spec.resources.cpus, given=given)
    dropped = threads.drop_inherited(spec.site.env)  # a launcher's OMP_NUM_THREADS=1 (Snakemake)
    threads.apply(plan)
    rec.hardware["cpus_given"] = plan.cpus
    rec.hardware["threads"] = plan.as_record()
    if dropped:
        rec.hardware["threads"]["inherited_dropped"] = dropped


def _still_current(spec_path: Path, uid: str | None) -> bool:
    """Whether ``spec_path`` still names this job's attempt (its ``run_uid``): a job that
    outlived its submitter must never write its record over a later attempt's."""
    if uid is None:
        return True
    try:
        data = read_json(spec_path)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get(record.RUN_UID) == uid


#: the run's energy artifacts, relative to artifacts/ (docs/benchmarks/energy.md)
POWER_TRACE = "energy/power_trace.csv"
ENERGY_WINDOWS = "energy/windows.json"


def _meter() -> EnergyMeter | None:
    """The energy meter of this process (None: it could not even be made; never fatal)."""
    task = distributed.task_from_env()
    try:
        return open_meter(per_rank=task.world_size > 1, measure_host=task.local_rank == 0)
    except Exception as exc:  # noqa: BLE001 - energy is a figure, not a reason to fail
        print(f"hopperlab: no energy meter: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def attach_energy(rec: Recorder, result: Result) -> None:
    """The meter's figures into the record, its state into the hardware, its trace and
    windows into the artifacts."""
    rec.log_metrics(result.metrics)
    for k, v in result.tags.items():
        rec.set_tag(k, v)
    problems = window_errors()
    if problems:
        rec.set_tag(N.TAG_ERRORS, "; ".join(problems)[:500])
    rec.hardware["gpu_state"] = result.gpu_state
    write_text_atomic(rec.artifact_path(POWER_TRACE), result.trace_csv)
    write_json_atomic(rec.artifact_path(ENERGY_WINDOWS), result.windows)


def _run_metered(workload: Any, spec: RunSpec, rec: Recorder) -> None:
    """The workload under the energy meter: every way out leaves the figures recorded."""
    meter = _meter()
    if meter is None:
        workload(spec, rec)
        return
    try:
        with listening(meter.listener):
            meter.start()
            workload(spec, rec)
    finally:
        try:
            attach_energy(rec, meter.finish())
        except Exception as exc:  # noqa: BLE001
            rec.set_tag(N.TAG_ERRORS, f"{type(exc).__name__}: {exc}"[:500])


def execute(spec_path: str, run_dir: str | None = None) -> dict[str, Any]:
    """Run the spec at ``spec_path``; the environment it changed is put back after, so that an
    in-process (debug) run leaves its caller's ``OMP_NUM_THREADS`` and the site's ``env:`` as
    they were (a test once started its Slurm cluster with one CPU a node because of it)."""
    saved = dict(os.environ)
    try:
        return _execute(spec_path, run_dir)
    finally:
        for name in set(os.environ) - set(saved):
            os.environ.pop(name, None)
        for name, value in saved.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


def _execute(spec_path: str, run_dir: str | None = None) -> dict[str, Any]:
    """Run the spec at ``spec_path`` (a run directory's spec.json); return the record.

    A task of a job with several (``distributed.task_from_env``) runs as one rank, recording
    into ``ranks/<r>/`` (``run_dir``) through this same function."""
    silence_known_noise()
    if run_dir is None and (task := distributed.task_from_env()).world_size > 1:
        return distributed.execute_rank(spec_path, task, execute)
    spec_data = read_json(Path(spec_path))
    folder = Path(run_dir) if run_dir else Path(spec_path).parent
    identity = {k: spec_data[k] for k in ("key", "family", "experiment", "variant")}
    if record.RUN_UID in spec_data:  # the attempt's identity in MLflow, made by submit
        identity[record.RUN_UID] = spec_data[record.RUN_UID]
    uid = spec_data.get(record.RUN_UID)
    rec = Recorder(folder, identity=identity, attempt=int(spec_data.get("attempt", 1)),
                   job_started=record.process_started_at(),
                   may_write=lambda: _still_current(Path(spec_path), uid))
    rec.slurm = distributed.task_from_env().record  # the scheduler's job (the record's slurm)
    try:
        rec.hardware = hardware.fingerprint()
        rec.hardware["container"] = inside_container()  # what the job sees of its image
        rec.hardware["gpu_index"] = os.environ.get("CUDA_VISIBLE_DEVICES")  # its GPU slot(s)
        if FORKED_ENV in os.environ:  # its imports done once for the workflow (run/warm.py)
            rec.hardware["warm_start"] = f"forked from the warm starter, pid {os.environ[FORKED_ENV]}"
        elif os.environ.get(COLD_ENV):  # a starter was asked, and why it did not fork this job
            rec.hardware["warm_start"] = f"started cold: {os.environ[COLD_ENV]}"
        write_json_atomic(folder / record.HARDWARE_FILE, rec.hardware)
        spec = RunSpec.from_dict(spec_data)
        os.environ.update(spec.site.env)  # as submitted; again for an in-process (debug) run
        _size_threads(spec, rec)
        write_json_atomic(folder / record.HARDWARE_FILE, rec.hardware)
        info = family_info(spec.family)
        entry = info.engine_of(spec.params).load_entry()  # the run's engine's entry
        # the meter spans every repeat: energy is the whole run's
        _run_metered(lambda s, r: repeats.measure(entry, s, r, info), spec, rec)
        write_json_atomic(folder / record.HARDWARE_FILE, rec.hardware)
    except SkipRun as exc:
        return rec.finish("skipped", str(exc))
    except BaseException as exc:  # noqa: BLE001 - every way out must leave a record
        if _is_oom(exc):
            return rec.finish("oom", f"{type(exc).__name__}: {exc}"[:2000])
        if rec.may_write():
            write_text_atomic(folder / record.TRACEBACK_FILE, traceback.format_exc())
        rec.finish("failed", f"{type(exc).__name__}: {exc}"[:2000])
        raise
    return rec.finish("ok")
