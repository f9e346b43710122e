"""Submit one run through submitit (Slurm, local subprocess or in-process) and wait for it.

The job's command is [container exec prefix] + [profiler prefix] + python: submitit lets us
replace its ``python`` with any command line, so an Apptainer image or ``nsys profile`` wraps
the very process that runs the workload. Polling stays gentle: at most one ``sacct`` call per
``poll_interval_s`` per submitting process.
"""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hopperlab.node.containers import exec_prefix, job_binds
from hopperlab.profiling import profiler_prefix
from hopperlab.config.spec import RunSpec

#: Slurm states that mean "ran out of its time limit" (submitit reports them as uncompleted).
TIMEOUT_STATES = frozenset({"TIMEOUT", "DEADLINE"})


@dataclass
class JobOutcome:
    """What the scheduler says about a finished job; ``result`` is the runner's return value."""

    job_id: str | None
    state: str
    result: Any = None
    error: str | None = None
    #: where submitit kept the job's stdout/stderr (copied into the run directory's logs/)
    stdout: Path | None = None
    stderr: Path | None = None

    @property
    def timed_out(self) -> bool:
        return self.state.upper().split()[0] in TIMEOUT_STATES if self.state else False


def container_prefix(spec: RunSpec, run_dir: Path) -> list[str]:
    """``<runtime> exec [--nv] --bind <results>,<assets> <image>.sif`` for a container site."""
    c = spec.site.container
    if not c.image:
        return []
    results = Path(run_dir).resolve().parents[2]  # results/<family>/<experiment>/<variant>
    binds = job_binds([results, spec.site.assets_dir], extra=c.binds)
    return exec_prefix(str(c.runtime), Path(str(c.image_file)), binds,
                       gpus=spec.resources.gpus > 0)


def job_python(spec: RunSpec, run_dir: Path) -> str:
    """The command submitit starts instead of plain python (a shell-quoted string).

    With a profiler, ``profiler_prefix`` puts hopperlab's profile wrapper (and ``nsys
    profile``) before python: the wrapper finishes the profile once the job's python has
    exited (``hopperlab.profiling.finish`` says why there).
    """
    python = "python" if spec.site.container.image else sys.executable
    parts = container_prefix(spec, run_dir) + profiler_prefix(spec, run_dir, python) + [python]
    return shlex.join(parts)


def make_executor(spec: RunSpec, run_dir: Path) -> Any:
    """The submitit executor the site asks for, with the spec's resources."""
    import submitit

    site, res = spec.site, spec.resources
    folder = run_dir / "submitit"
    python = job_python(spec, run_dir)
    name = f"hl-{spec.family}-{spec.experiment}-{spec.variant}"[:100]
    if site.executor == "slurm":
        from submitit.slurm import slurm as slurm_mod

        # One sacct call per poll interval for all jobs of this process.
        slurm_mod.SlurmJob.watcher = slurm_mod.SlurmInfoWatcher(
            delay_s=max(1, int(site.poll_interval_s)))
        ex = submitit.SlurmExecutor(folder=folder, python=python, max_num_timeout=0)
        params: dict[str, Any] = dict(
            job_name=name, time=res.time_min, cpus_per_task=res.cpus, mem=f"{int(res.mem_gb * 1024)}M",
            ntasks_per_node=1, nodes=1, stderr_to_stdout=False,
            # submitit's default USR2 90 s before the limit, and its "under 10 min means already
            # timed out" rule, turn a short limit into a FAILED job: no early signal, no requeue.
            signal_delay_s=0,
        )
        if res.gpus:
            params["gpus_per_node"] = res.gpus
        s = site.slurm
        for key in ("partition", "account", "qos", "constraint"):
            if getattr(s, key):
                params[key] = getattr(s, key)
        if s.setup:
            params["setup"] = list(s.setup)
        if s.extra_sbatch:
            params["additional_parameters"] = dict(s.extra_sbatch)
        ex.update_parameters(**params)
        return ex
    if site.executor == "local":
        ex = submitit.LocalExecutor(folder=folder, python=python, max_num_timeout=0)
        ex.update_parameters(timeout_min=res.time_min, gpus_per_node=res.gpus,
                             tasks_per_node=1, nodes=1, signal_delay_s=0)
        return ex
    if site.executor == "debug":
        return submitit.DebugExecutor(folder=folder)
    raise ValueError(f"{site.source}: executor: unknown executor {site.executor!r}")


def _state(job: Any) -> str:
    try:
        return str(job.state)
    except Exception:  # noqa: BLE001 - a scheduler hiccup must not lose the outcome
        return "UNKNOWN"


def run_job(spec: RunSpec, run_dir: Path, func: Callable[..., Any], *args: Any,
            on_submitted: Callable[[str], None] | None = None) -> JobOutcome:
    """Submit ``func(*args)`` as a job for ``spec`` and wait, polling gently."""
    from submitit.core.utils import FailedJobError, UncompletedJobError

    executor = make_executor(spec, run_dir)
    job = executor.submit(func, *args)
    job_id = str(job.job_id)
    if on_submitted:
        on_submitted(job_id)
    poll = min(1.0, spec.site.poll_interval_s)
    if spec.site.executor != "debug":
        while not job.done():
            time.sleep(poll)
    outcome = JobOutcome(job_id=job_id if spec.site.executor == "slurm" else None, state="UNKNOWN")
    try:
        outcome.result = job.result()
        outcome.state = "COMPLETED"
    except UncompletedJobError as exc:
        outcome.error = str(exc)
        outcome.state = _final_state(job, default="FAILED")
        if "timed-out" in str(exc) or "timeout" in str(exc).lower():
            outcome.state = "TIMEOUT" if outcome.state in ("UNKNOWN", "FAILED") else outcome.state
    except FailedJobError as exc:
        outcome.error = str(exc)
        outcome.state = _final_state(job, default="FAILED")
    if spec.site.executor != "debug":
        outcome.stdout, outcome.stderr = Path(job.paths.stdout), Path(job.paths.stderr)
    elif spec.knobs.profiler == "torch":
        # no command line to wrap in-process: finish the profile here (nsys is refused before)
        from hopperlab.profiling.command import site_settings
        from hopperlab.profiling.finish import finish_profile

        settings = site_settings(spec)
        finish_profile(run_dir, "torch", gap_threshold_us=settings.gap_threshold_us)
    return outcome


def _final_state(job: Any, default: str) -> str:
    """Ask the scheduler once more (forced) for the final state of a job that did not complete."""
    try:
        info = job.get_info(mode="force") if hasattr(job, "get_info") else {}
        state = (info or {}).get("State") or (info or {}).get("jobState") or _state(job)
    except Exception:  # noqa: BLE001
        state = _state(job)
    state = str(state).split()[0].upper() if state else default
    if state in ("", "UNKNOWN", "RUNNING", "FINISHED", "COMPLETED"):
        return default
    return state
