"""Submit one run through the site's backend (``hopperlab.backends``: Slurm, a local
subprocess, in-process...) and wait for it.

The job's command is [container exec prefix] + [profiler prefix] + python: submitit lets us
replace its ``python`` with any command line, so an Apptainer image or ``nsys profile`` wraps
the very process that runs the workload. The backend makes the submitit executor from a
``JobRequest`` and answers what waiting needs (a watch while queued, how to stop the job, who
enforces the time limit).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hopperlab import backends
from hopperlab.backends.base import CANCEL_WAIT_S, Executor, JobHandle, JobRequest, JobResources
from hopperlab.config.spec import RunSpec
from hopperlab.core.errors import NodeError, SpecError
from hopperlab.core.rundir import STOPPED_BY_SUBMITTER
from hopperlab.node import charliecloud, oom_kills
from hopperlab.node.containers import (
    CHARLIECLOUD,
    PYXIS,
    SITE_EXISTING_KEY,
    SITE_IMAGE_KEY,
    SITE_RUNTIME_KEY,
    job_binds,
    job_exec_prefix,
    resolve_site_runtime,
)
from hopperlab.profiling import profiler_prefix
from hopperlab.profiling.command import site_settings
from hopperlab.profiling.finish import finish_profile
from hopperlab.run import distributed, jobenv, ranks, scheduler
from hopperlab.run.warm_plan import cold_env, warm_plan

#: what hopperlab says of a job it stopped at its time limit itself
TIMEOUT = "TIMEOUT"


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
    #: why we stopped waiting ourselves (the local time limit, a state nobody knew), if we did
    reason: str | None = None
    #: (stdout, stderr) of each task of a job of several, by rank
    task_logs: list[tuple[Path, Path]] = field(default_factory=list)
    #: the signal that stopped the submitting process while it waited (the job was cancelled)
    interrupted: BaseException | None = None
    #: the kernel's word that it killed the job's process for memory (a job of this host)
    kernel_oom: str | None = None
    #: the end states that mean a time limit (the backend's ``Launcher.timeout_states``)
    timeout_states: frozenset[str] = frozenset({TIMEOUT})

    @property
    def timed_out(self) -> bool:
        return self.state.upper().split()[0] in self.timeout_states if self.state else False


def _job_folders(spec: RunSpec, run_dir: Path) -> list[Path | str]:
    """What a job reads and writes: the results folder (results/<family>/<experiment>/<variant>
    is the run directory) and the assets folder."""
    return [Path(run_dir).resolve().parents[2], spec.site.assets_dir]


def container_prefix(spec: RunSpec, run_dir: Path) -> list[str]:
    """``<runtime> exec [--nv] --bind <results>,<assets> <image>.sif`` for a container site
    (``ch-run ... <image>.ch --`` for charliecloud; nothing for pyxis: ``srun_args``)."""
    c = spec.site.container
    if not c.image or c.runtime == PYXIS:
        return []
    runtime = resolve_site_runtime(spec.site.source, c.runtime, c.image)  # submit checks more
    return job_exec_prefix(str(runtime), Path(str(c.image_file)),
                           _job_folders(spec, run_dir), c.binds,
                           gpus=spec.resources.gpus > 0, env=spec.site.env)


def container_srun_args(spec: RunSpec, run_dir: Path) -> list[str]:
    """The task launcher's options of a pyxis site's job (image, mounts, working folder: the
    backend's words); [] otherwise."""
    c = spec.site.container
    if not c.image or c.runtime != PYXIS:
        return []
    binds = job_binds(_job_folders(spec, run_dir), c.binds)
    return backends.launcher(spec.site.executor).container_task_args(str(c.image_file), binds,
                                                                     binds[0])


def container_runtime(spec: RunSpec) -> str | None:
    """The container runtime on this machine's PATH for the spec's site (None: no container);
    SpecError, naming the site file and key, when the site's image cannot run here: no runtime,
    no image where the site says, no GPU libraries in a Charliecloud image for a GPU run."""
    c = spec.site.container
    runtime = resolve_site_runtime(spec.site.source, c.runtime, c.image)
    if runtime is not None:
        check_image_ready(spec, runtime)
    return runtime


def check_image_ready(spec: RunSpec, runtime: str) -> None:
    """Refuse, in one line naming the site file and key, an image the job could not start."""
    c, source = spec.site.container, spec.site.source
    image = str(c.image_file)
    key = SITE_EXISTING_KEY if c.existing else SITE_IMAGE_KEY
    refusal = backends.launcher(spec.site.executor).container_refusal(runtime)
    if refusal:
        raise SpecError(f"{source}: {SITE_RUNTIME_KEY}: {refusal}; use another "
                        f"{SITE_RUNTIME_KEY}")
    if runtime == PYXIS:
        if "#" in image or "://" in image:
            return  # a registry reference: pyxis pulls it on the node
    if not Path(image).exists():
        how = ("point it at an existing image" if c.existing else
               f"build it first: snakemake {_relative(image)}")
        raise SpecError(f"{source}: {key}: the image {image} does not exist; {how}")
    if runtime == CHARLIECLOUD:
        if not charliecloud.is_image_dir(image):
            raise SpecError(f"{source}: {key}: {image} is not a Charliecloud image directory")
        if spec.resources.gpus > 0 and not charliecloud.has_gpu_libraries(image):
            raise SpecError(f"{source}: {key}: the run asks for {spec.resources.gpus} GPU(s) but "
                            f"{image} holds no NVIDIA driver libraries: run `ch-fromhost --nvidia "
                            f"{image}` on a GPU node first (containers/README.md)")


def _relative(image: str) -> str:
    """``containers/<name>.<suffix>`` for the build hint (the workflow's target)."""
    path = Path(image)
    return f"{path.parent.name}/{path.name}"


def job_python(spec: RunSpec, run_dir: Path) -> str:
    """The command submitit starts instead of plain python (a shell-quoted string).

    With a profiler, ``profiler_prefix`` puts hopperlab's profile wrapper (and ``nsys
    profile``) before python: the wrapper finishes the profile once the job's python has
    exited (``hopperlab.profiling.finish`` says why there).
    """
    python = "python" if spec.site.container.image else sys.executable
    # each task of a distributed run profiles itself into ranks/<r>/ (the wrapper names r)
    profiled = (run_dir / ranks.RANKS_DIR / distributed.RANK_PLACEHOLDER
                if spec.resources.distributed else run_dir)
    parts = container_prefix(spec, run_dir) + profiler_prefix(spec, profiled, python) + [python]
    starter, _ = warm_plan(spec)  # the one decision; the reason of a cold one: job_request
    if starter:
        parts += ["-m", "hopperlab.run.warm_client", starter]
    return shlex.join(parts)


def job_request(spec: RunSpec, run_dir: Path) -> JobRequest:
    """What the site's backend is handed to submit ``spec``'s job."""
    res = spec.resources
    return JobRequest(
        key=spec.key, name=f"hl-{spec.family}-{spec.experiment}-{spec.variant}"[:100],
        folder=run_dir / "submitit", python=job_python(spec, run_dir),
        resources=JobResources(gpus=res.gpus, cpus=res.cpus, mem_gb=res.mem_gb,
                               time_min=res.time_min, nodes=res.nodes,
                               tasks_on_node=res.tasks_on_node),
        settings=spec.site.own_settings, poll_interval_s=spec.site.poll_interval_s,
        env={**spec.site.env, **cold_env(spec)},
        task_launcher_args=tuple(container_srun_args(spec, run_dir)),
        source=spec.site.source, exclusive=spec.host_bound is not None)


def make_executor(spec: RunSpec, run_dir: Path, log: Callable[[str], None] = print
                  ) -> Executor:
    """The submitit executor the site's backend makes, with the spec's resources."""
    return backends.launcher(spec.site.executor).make_executor(job_request(spec, run_dir), log)


def _state(job: JobHandle) -> str:
    try:
        return str(job.state)
    except Exception:  # noqa: BLE001 - a scheduler hiccup must not lose the outcome
        return "UNKNOWN"


def run_job(spec: RunSpec, run_dir: Path, func: Callable[..., Any], *args: Any,
            on_submitted: Callable[[str], None] | None = None,
            log: Callable[[str], None] = print,
            stop_when: Callable[[], str | None] | None = None) -> JobOutcome:
    """Submit ``func(*args)`` as a job for ``spec`` and wait, polling gently."""
    from submitit.core.utils import FailedJobError, UncompletedJobError

    backend = spec.site.backend
    launcher = backends.launcher(spec.site.executor)
    executor = make_executor(spec, run_dir, log)
    oom_before = oom_kills.read_counts()
    if spec.site.container.image and spec.site.container.runtime == CHARLIECLOUD:
        os.environ.update(charliecloud.user_env())  # ch-run will not start without $USER
    try:
        with jobenv.job_environment(spec.site.env):  # the site's env: in, secrets: out
            job = launcher.submit(executor, func, *args)
    except Exception as exc:  # noqa: BLE001 - sbatch refused: nothing runs, nothing to settle
        raise NotSubmitted(_submit_error(spec, exc)) from exc
    job_id = str(job.job_id)
    if on_submitted:
        on_submitted(job_id)
    outcome = JobOutcome(job_id=job_id if backend.job_handle == "scheduler" else None,
                         state="UNKNOWN",
                         timeout_states=launcher.timeout_states)
    if not backend.in_process:
        try:
            stop = _wait(spec, job, log, stop_when)
        except scheduler.Interrupted as exc:
            with scheduler.uninterrupted():
                stop = _stop_interrupted(spec, job, exc)
            outcome.interrupted = exc
        outcome.stdout, outcome.stderr = Path(job.paths.stdout), Path(job.paths.stderr)
        outcome.task_logs = [(Path(t.paths.stdout), Path(t.paths.stderr))
                             for t in getattr(job, "_sub_jobs", [])]
        if stop:
            outcome.state, outcome.reason = stop
            outcome.error = outcome.reason
            return outcome
        outcome.kernel_oom = launcher.kernel_memory_kill(job, oom_before)
    try:
        # a job of several tasks answers one result per task: the run's is rank 0's
        outcome.result = job.results()[0] if spec.resources.distributed else job.result()
        outcome.state = "COMPLETED"
    except UncompletedJobError as exc:
        outcome.error = str(exc)
        outcome.state = _final_state(job, default="FAILED")
        if "timed-out" in str(exc) or "timeout" in str(exc).lower():
            outcome.state = "TIMEOUT" if outcome.state in ("UNKNOWN", "FAILED") else outcome.state
    except FailedJobError as exc:
        outcome.error = str(exc)
        outcome.state = _final_state(job, default="FAILED")
    if backend.in_process and spec.knobs.profiler == "torch":
        # no command line to wrap in-process: finish the profile here (nsys is refused before)
        settings = site_settings(spec)
        finish_profile(run_dir, "torch", gap_threshold_us=settings.gap_threshold_us)
    return outcome


def _wait(spec: RunSpec, job: JobHandle, log: Callable[[str], None] = print,
          stop_when: Callable[[], str | None] | None = None) -> tuple[str, str] | None:
    """Poll until the job is done; ``(state, error)`` when we stopped waiting ourselves.

    Where the scheduler does not enforce the time limit (``enforces_time_limit``: the local
    executor) it is ours: submitit's controller would end the job with a SIGINT that the job
    cannot tell from a crash. We give up on a job when its backend says so (``given_up``:
    Slurm's state unknown to sacct and squeue for too long).
    """
    backend = spec.site.backend
    launcher = backends.launcher(backend.name)
    poll = min(1.0, spec.site.poll_interval_s)
    limit_s = spec.resources.time_min * 60
    t0 = time.monotonic()
    watch = launcher.watch(job, spec.key, spec.site.poll_interval_s, log)
    while not job.done():
        if watch is not None:
            watch()
        why = stop_when() if stop_when is not None else None
        if why:
            launcher.stop(job, spec.site.poll_interval_s, None)
            return "CANCELLED", why
        if not backend.enforces_time_limit and time.monotonic() - t0 >= limit_s:
            launcher.stop(job, spec.site.poll_interval_s, None)
            return TIMEOUT, (f"time limit of {spec.resources.time_min} min reached "
                             f"({spec.site.executor} executor)")
        lost = launcher.given_up(job)
        if lost:
            return "UNKNOWN", lost
        time.sleep(poll)
    return None


class NotSubmitted(NodeError):
    """The scheduler refused the job (or could not be reached): nothing ran."""


def _submit_error(spec: RunSpec, exc: BaseException) -> str:
    """One line: which site, what the scheduler said (its backend picks the words out)."""
    detail = backends.launcher(spec.site.executor).refusal(exc)
    return f"{spec.site.source}: {spec.site.executor} refused the job of {spec.key}: {detail[:400]}"


def _stop_interrupted(spec: RunSpec, job: JobHandle, exc: BaseException) -> tuple[str, str]:
    """The submitting process got SIGINT/SIGTERM while its job ran: cancel the job and wait for
    it to leave the scheduler, so that no later attempt runs beside it and it never writes into
    a later attempt's files."""
    what = getattr(exc, "signum", None)
    name = signal.Signals(what).name if what else "an interrupt"
    gone = backends.launcher(spec.site.executor).stop(job, spec.site.poll_interval_s,
                                                      CANCEL_WAIT_S)
    if spec.site.backend.job_handle == "scheduler":
        note = "cancelled" if gone else "asked the scheduler to cancel it, but it was still queued"
    else:
        note = "stopped" if gone else "asked it to stop, but it still ran"
    return "CANCELLED", f"{STOPPED_BY_SUBMITTER} {name}; job {job.job_id} {note}"


def _final_state(job: JobHandle, default: str) -> str:
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
