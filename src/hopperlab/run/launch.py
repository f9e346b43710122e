"""Submit one run through submitit (Slurm, local subprocess or in-process) and wait for it.

The job's command is [container exec prefix] + [profiler prefix] + python: submitit lets us
replace its ``python`` with any command line, so an Apptainer image or ``nsys profile`` wraps
the very process that runs the workload. Polling stays gentle: at most one ``sacct`` call per
``poll_interval_s`` per submitting process.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hopperlab.config.spec import RunSpec
from hopperlab.core.errors import SpecError
from hopperlab.node import charliecloud, pyxis
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
from hopperlab.core.errors import NodeError
from hopperlab.run import distributed, jobenv, ranks, scheduler

#: Slurm states that mean "ran out of its time limit" (submitit reports them as uncompleted).
TIMEOUT_STATES = frozenset({"TIMEOUT", "DEADLINE"})
#: The local controller's own limit lies this far past ours: it only stops orphans (its SIGINT
#: would read as a crash, "KeyboardInterrupt"); ``run_job`` enforces the limit and says TIMEOUT.
LOCAL_BACKSTOP_MIN = 1
#: Give up on a Slurm job no source (sacct, squeue) has known for this long.
UNKNOWN_STATE_LIMIT_S = 1800.0


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

    @property
    def timed_out(self) -> bool:
        return self.state.upper().split()[0] in TIMEOUT_STATES if self.state else False


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
    """The srun options of a pyxis site's job (image, mounts, working folder); [] otherwise."""
    c = spec.site.container
    if not c.image or c.runtime != PYXIS:
        return []
    binds = job_binds(_job_folders(spec, run_dir), c.binds)
    return pyxis.srun_args(str(c.image_file), binds, workdir=binds[0])


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
    if runtime == PYXIS:
        if not pyxis.has_plugin(_srun_help()):
            raise SpecError(f"{source}: {SITE_RUNTIME_KEY}: pyxis, but `srun --help` here lists "
                            f"no {pyxis.IMAGE_OPTION}: the pyxis plugin is not loaded on this "
                            f"cluster (plugstack.conf); use another {SITE_RUNTIME_KEY}")
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


@functools.cache
def _srun_help() -> str:
    """``srun --help`` of this machine (the pyxis plugin adds its options there); once."""
    try:
        done = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=60,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout + done.stderr


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
    return shlex.join(parts)


def squeue_states(job_ids: list[str]) -> dict[str, dict[str, str]]:
    """The controller's view of jobs, shaped like submitit's sacct info (``JobID``, ``State``).

    slurmctld keeps an ended job (CANCELLED, TIMEOUT, ...) for ``MinJobAge`` seconds, so this
    answers what sacct cannot while slurmdbd is down. An unknown job is simply absent.
    """
    cmd = ["squeue", "-h", "--states=all", "-o", "%i|%T|%N", "-j", ",".join(job_ids)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    info = {}
    for line in out.splitlines():
        job, state, nodes = (line.split("|") + ["", ""])[:3]
        if job.strip() in job_ids and state.strip():
            info[job.strip()] = {"JobID": job.strip(), "State": state.strip(), "NodeList": nodes}
    return info


def _first_error_line(exc: BaseException) -> str:
    """What sacct said on stderr (its last line), else the exception itself."""
    stderr = getattr(exc, "stderr", None) or b""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else str(stderr)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[-1] if lines else f"{type(exc).__name__}: {exc}")[:300]


@functools.cache
def _watcher_class() -> type:
    """submitit's sacct watcher, taught to ask squeue when sacct fails and to say so once per job.

    Without it, a job killed while slurmdbd is down (TIMEOUT, CANCELLED) is never seen to end,
    and submitit logs "Bypassing sacct error" on every poll. Built lazily: submitit is heavy.
    """
    from submitit.slurm.slurm import SlurmInfoWatcher

    class SlurmStateWatcher(SlurmInfoWatcher):
        def __init__(self, delay_s: int, log: Callable[[str], None]) -> None:
            super().__init__(delay_s=delay_s)
            self.log = log
            self._told: set[str] = set()
            self._known_at: dict[str, float] = {}

        def unknown_for_s(self, job_id: str) -> float:
            """Seconds since sacct or squeue last knew ``job_id`` (or since it was registered)."""
            return time.monotonic() - self._known_at.setdefault(job_id, time.monotonic())

        def update(self) -> None:
            """submitit's update (the same bookkeeping), with squeue for what sacct cannot say."""
            command = self._make_command()
            if command is None:
                return
            self._num_calls += 1
            ids = sorted({x.split("_")[0] for x in self._registered - self._finished})
            info: dict[str, dict[str, str]] = {}
            try:
                self._output = subprocess.run(command, capture_output=True, check=True,
                                              timeout=120).stdout
                info = self.read_info(self._output)
            except (OSError, subprocess.SubprocessError) as exc:
                self._say_sacct_failed(ids, exc)
            missing = [j for j in ids if j not in info]
            if missing:
                info.update(squeue_states(missing))
            self._info_dict.update(info)
            for job_id in info:
                self._known_at[job_id] = time.monotonic()
            self._last_status_check = time.time()
            for job_id in self._registered - self._finished:
                if self.is_done(job_id, mode="cache"):
                    self._finished.add(job_id)

        def _say_sacct_failed(self, ids: list[str], exc: BaseException) -> None:
            for job_id in ids:
                if job_id not in self._told:
                    self._told.add(job_id)
                    self.log(f"[hopperlab] sacct failed ({_first_error_line(exc)}); job "
                             f"{job_id}'s state comes from squeue until accounting answers")

    return SlurmStateWatcher


def slurm_watcher(delay_s: int, log: Callable[[str], None] = print) -> Any:
    """The watcher every SlurmJob of this process shares (one sacct call per ``delay_s``)."""
    return _watcher_class()(delay_s, log)


def make_executor(spec: RunSpec, run_dir: Path, log: Callable[[str], None] = print) -> Any:
    """The submitit executor the site asks for, with the spec's resources."""
    import submitit

    site, res = spec.site, spec.resources
    folder = run_dir / "submitit"
    python = job_python(spec, run_dir)
    name = f"hl-{spec.family}-{spec.experiment}-{spec.variant}"[:100]
    if site.executor == "slurm":
        from submitit.slurm import slurm as slurm_mod

        # One sacct call per poll interval for all jobs of this process (squeue when it fails).
        slurm_mod.SlurmJob.watcher = slurm_watcher(max(1, int(site.poll_interval_s)), log)
        ex = submitit.SlurmExecutor(folder=folder, python=python, max_num_timeout=0)
        # cpus and memory are per task; Slurm's --mem is per node
        mem_mb = int(res.mem_gb * 1024) * res.tasks_on_node
        params: dict[str, Any] = dict(
            job_name=name, time=res.time_min, cpus_per_task=res.cpus, mem=f"{mem_mb}M",
            ntasks_per_node=res.tasks_on_node, nodes=res.nodes, stderr_to_stdout=False,
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
        srun_args = container_srun_args(spec, run_dir)
        if srun_args:  # enroot + pyxis: the task starts inside the image; the env goes with it
            params["srun_args"] = srun_args
            params["setup"] = list(s.setup) + pyxis.env_setup(site.env)
        ex.update_parameters(**params)
        return ex
    if site.executor == "local":
        ex = submitit.LocalExecutor(folder=folder, python=python, max_num_timeout=0)
        if res.distributed:  # every task of this job reads the port this process found free
            os.environ[distributed.MASTER_PORT_ENV] = str(distributed.free_port())
        ex.update_parameters(timeout_min=res.time_min + LOCAL_BACKSTOP_MIN,
                             gpus_per_node=res.gpus,
                             tasks_per_node=res.tasks_on_node, nodes=1, signal_delay_s=0)
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
            on_submitted: Callable[[str], None] | None = None,
            log: Callable[[str], None] = print,
            stop_when: Callable[[], str | None] | None = None) -> JobOutcome:
    """Submit ``func(*args)`` as a job for ``spec`` and wait, polling gently."""
    from submitit.core.utils import FailedJobError, UncompletedJobError

    executor = make_executor(spec, run_dir, log)
    if spec.site.container.image and spec.site.container.runtime == CHARLIECLOUD:
        os.environ.update(charliecloud.user_env())  # ch-run will not start without $USER
    try:
        with jobenv.job_environment(spec.site.env):  # the site's env: in, secrets: out
            job = executor.submit(func, *args)
    except Exception as exc:  # noqa: BLE001 - sbatch refused: nothing runs, nothing to settle
        raise NotSubmitted(_submit_error(spec, exc)) from exc
    job_id = str(job.job_id)
    if on_submitted:
        on_submitted(job_id)
    outcome = JobOutcome(job_id=job_id if spec.site.executor == "slurm" else None, state="UNKNOWN")
    if spec.site.executor != "debug":
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
    if spec.site.executor == "debug" and spec.knobs.profiler == "torch":
        # no command line to wrap in-process: finish the profile here (nsys is refused before)
        settings = site_settings(spec)
        finish_profile(run_dir, "torch", gap_threshold_us=settings.gap_threshold_us)
    return outcome


def _wait(spec: RunSpec, job: Any, log: Callable[[str], None] = print,
          stop_when: Callable[[], str | None] | None = None) -> tuple[str, str] | None:
    """Poll until the job is done; ``(state, error)`` when we stopped waiting ourselves.

    Locally the time limit is ours to enforce: submitit's controller would end the job with a
    SIGINT that the job cannot tell from a crash. On Slurm we give up on a job whose state no
    source has known for ``UNKNOWN_STATE_LIMIT_S`` (accounting and controller both away).
    """
    poll = min(1.0, spec.site.poll_interval_s)
    limit_s = spec.resources.time_min * 60
    t0 = time.monotonic()
    queue = _QueueWatch(spec, str(job.job_id), log) if spec.site.executor == "slurm" else None
    while not job.done():
        if queue is not None:
            queue.check()
        why = stop_when() if stop_when is not None else None
        if why:
            _stop(spec, job)
            return "CANCELLED", why
        if spec.site.executor == "local" and time.monotonic() - t0 >= limit_s:
            _cancel_and_wait(job)
            return "TIMEOUT", (f"time limit of {spec.resources.time_min} min reached "
                               "(local executor)")
        unknown_s = getattr(job.watcher, "unknown_for_s", lambda _: 0.0)(str(job.job_id))
        if unknown_s >= UNKNOWN_STATE_LIMIT_S:
            job.cancel(check=False)
            return "UNKNOWN", (f"neither sacct nor squeue knew job {job.job_id} for "
                               f"{unknown_s:.0f} s; stopped waiting and asked Slurm to cancel it")
        time.sleep(poll)
    return None


class NotSubmitted(NodeError):
    """The scheduler refused the job (or could not be reached): nothing ran."""


def _submit_error(spec: RunSpec, exc: BaseException) -> str:
    """One line: which site, what the scheduler said."""
    text = " ".join(str(exc).split())
    said = re.findall(r"sbatch: error: ([^\n]+?)(?= sbatch: error:|$)", text)
    detail = "; ".join(said) if said else f"{type(exc).__name__}: {text}"
    return f"{spec.site.source}: {spec.site.executor} refused the job of {spec.key}: {detail[:400]}"


def _stop_interrupted(spec: RunSpec, job: Any, exc: BaseException) -> tuple[str, str]:
    """The submitting process got SIGINT/SIGTERM while its job ran: cancel the job and wait for
    it to leave the scheduler, so that no later attempt runs beside it and it never writes into
    a later attempt's files."""
    what = getattr(exc, "signum", None)
    name = signal.Signals(what).name if what else "an interrupt"
    if spec.site.executor == "slurm":
        scheduler.cancel(str(job.job_id))
        gone = scheduler.wait_until_gone(str(job.job_id), min(2.0, spec.site.poll_interval_s))
        note = "cancelled" if gone else "asked Slurm to cancel it, but it was still queued"
    else:
        job.cancel(check=False)
        gone = scheduler.poll_until(job.done, 0.1, scheduler.CANCEL_WAIT_S)
        note = "stopped" if gone else "asked it to stop, but it still ran"
    return "CANCELLED", f"the submitting process got {name}; job {job.job_id} {note}"


def _stop(spec: RunSpec, job: Any) -> None:
    """Cancel the job and wait until it has ended (Slurm: left the queue)."""
    if spec.site.executor == "slurm":
        scheduler.cancel(str(job.job_id))
        scheduler.wait_until_gone(str(job.job_id), min(2.0, spec.site.poll_interval_s))
    else:
        _cancel_and_wait(job)


class _QueueWatch:
    """Says, once per change, why a Slurm job still waits in the queue (a drained node, too
    few resources...): a run that waits must never wait without a word. Asks squeue at most
    once per poll interval, and only until the job has started."""

    def __init__(self, spec: RunSpec, job_id: str, log: Callable[[str], None]) -> None:
        self.spec, self.job_id, self.log = spec, job_id, log
        self.every_s = max(1.0, spec.site.poll_interval_s)
        self.next_at = 0.0
        self.said: str | None = None
        self.started = False

    def check(self) -> None:
        if self.started or time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.every_s
        state, reason = scheduler.pending_reason(self.job_id)
        if state and state != "PENDING":
            self.started = True
            if self.said:
                self.log(f"[hopperlab] {self.spec.key}: job {self.job_id} started ({state})")
            return
        if state == "PENDING" and reason and reason != self.said and reason != "None":
            self.said = reason
            hint = (" (the nodes it needs are drained, down or reserved: `sinfo -R` says why)"
                    if re.search(r"ReqNodeNotAvail|DRAIN|DOWN|Nodes required", reason) else "")
            self.log(f"[hopperlab] {self.spec.key}: job {self.job_id} waits in the queue: "
                     f"{reason}{hint}")


def _cancel_and_wait(job: Any) -> None:
    """Stop a local job (SIGINT, then SIGKILL from submitit's controller) and wait for its end."""
    job.cancel(check=False)
    while not job.done():
        time.sleep(0.1)


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
