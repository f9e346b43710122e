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
from hopperlab.core import rundir as record
from hopperlab.core.rundir import (
    Recorder,
    SkipRun,
    read_json,
    write_json_atomic,
    write_text_atomic,
)
from hopperlab.node import hardware, threads
from hopperlab.node.containers import inside_container
from hopperlab.run import distributed
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


def slurm_identity() -> dict[str, Any] | None:
    """The Slurm job this process runs in, from the environment Slurm sets."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    return {"job_id": job_id, "array_job_id": array, "node": os.environ.get("SLURMD_NODENAME"),
            "partition": os.environ.get("SLURM_JOB_PARTITION"), "state": "RUNNING"}


def _size_threads(spec: RunSpec, rec: Recorder) -> None:
    """Size the thread pools from the CPUs this job was given (node.threads), before the
    workload imports anything that starts a pool; the plan goes into the hardware record."""
    plan = threads.job_threads(getattr(spec.resources, "threads", None) or {})
    threads.apply(plan)
    rec.hardware["cpus_given"] = plan.cpus
    rec.hardware["threads"] = plan.as_record()


def execute(spec_path: str, run_dir: str | None = None) -> dict[str, Any]:
    """Run the spec at ``spec_path`` (a run directory's spec.json); return the record.

    A task of a job with several (``distributed.task_from_env``) runs as one rank, recording
    into ``ranks/<r>/`` (``run_dir``) through this same function."""
    if run_dir is None and (task := distributed.task_from_env()).world_size > 1:
        return distributed.execute_rank(spec_path, task, execute)
    spec_data = read_json(Path(spec_path))
    run_dir = Path(run_dir) if run_dir else Path(spec_path).parent
    identity = {k: spec_data[k] for k in ("key", "family", "experiment", "variant")}
    if record.RUN_UID in spec_data:  # the attempt's identity in MLflow, made by submit
        identity[record.RUN_UID] = spec_data[record.RUN_UID]
    rec = Recorder(run_dir, identity=identity, attempt=int(spec_data.get("attempt", 1)))
    rec.slurm = slurm_identity()
    try:
        rec.hardware = hardware.fingerprint()
        rec.hardware["container"] = inside_container()  # what the job sees of its image
        write_json_atomic(run_dir / record.HARDWARE_FILE, rec.hardware)
        spec = RunSpec.from_dict(spec_data)
        _size_threads(spec, rec)
        write_json_atomic(run_dir / record.HARDWARE_FILE, rec.hardware)
        workload = family_info(spec.family).load_entry()
        workload(spec, rec)
    except SkipRun as exc:
        return rec.finish("skipped", str(exc))
    except BaseException as exc:  # noqa: BLE001 - every way out must leave a record
        if _is_oom(exc):
            return rec.finish("oom", f"{type(exc).__name__}: {exc}"[:2000])
        write_text_atomic(run_dir / record.TRACEBACK_FILE, traceback.format_exc())
        rec.finish("failed", f"{type(exc).__name__}: {exc}"[:2000])
        raise
    return rec.finish("ok")
