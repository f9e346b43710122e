"""Submitting to Slurm through submitit's SlurmExecutor, and asking Slurm about the job.

Polling stays gentle: one ``sacct`` call per ``poll_interval_s`` for all jobs of the submitting
process, ``squeue`` for what sacct cannot say (accounting down), ``squeue`` again, at most once
per poll interval, for why a queued job still waits. submitit is imported inside functions.
"""

from __future__ import annotations

import functools
import re
import subprocess
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

from hopperlab.backends.base import CANCEL_WAIT_S, Executor, JobHandle, JobRequest, Launcher
from hopperlab.backends.slurm import SlurmSettings, control, energy, nodes, pyxis
from hopperlab.node.containers import PYXIS


#: Slurm's end states of a job that ran out of its time limit
TIMEOUT_STATES = frozenset({"TIMEOUT", "DEADLINE"})
#: give up on a job no source (sacct, squeue) has known for this long
UNKNOWN_STATE_LIMIT_S = 1800.0

#: what Slurm says when it kills a job for its memory: the state (cgroup OOM) or slurmstepd's
#: line in the job's output (the accounting plugin's OverMemoryKill; the job then reads
#: CANCELLED or FAILED)
MEMORY_KILL = re.compile(r"exceeded (job )?memory limit|oom[_-]kill event|OOM Killed", re.I)


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


def make_executor(req: JobRequest, log: Callable[[str], None] = print) -> Executor:
    """submitit's SlurmExecutor with the request's resources and the site's ``slurm:``."""
    import submitit
    from submitit.slurm import slurm as slurm_mod

    res, s = req.resources, req.settings or SlurmSettings()
    # One sacct call per poll interval for all jobs of this process (squeue when it fails).
    slurm_mod.SlurmJob.watcher = slurm_watcher(max(1, int(req.poll_interval_s)), log)
    ex = submitit.SlurmExecutor(folder=req.folder, python=req.python, max_num_timeout=0)
    # cpus and memory are per task; Slurm's --mem is per node
    mem_mb = int(res.mem_gb * 1024) * res.tasks_on_node
    params: dict[str, Any] = dict(
        job_name=req.name, time=res.time_min, cpus_per_task=res.cpus, mem=f"{mem_mb}M",
        ntasks_per_node=res.tasks_on_node, nodes=res.nodes, stderr_to_stdout=False,
        # submitit's default USR2 90 s before the limit, and its "under 10 min means already
        # timed out" rule, turn a short limit into a FAILED job: no early signal, no requeue.
        signal_delay_s=0,
    )
    if res.gpus:
        params["gpus_per_node"] = res.gpus
    if req.exclusive:  # a host-bound run: its node to itself
        params["exclusive"] = True
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(s, key):
            params[key] = getattr(s, key)
    if s.setup:
        params["setup"] = list(s.setup)
    # No requeue behind the submitter's back: after a node failure Slurm would run the job again
    # (all of it, on the nodes it had) once the submitter has recorded the run failed, and that
    # second run rewrites the record; retries are the workflow's (a new attempt). A site that
    # wants Slurm's requeue says so in extra_sbatch.
    extra = dict(s.extra_sbatch or {})
    if not {"requeue", "no_requeue", "no-requeue"} & set(extra):
        extra["no_requeue"] = True
    params["additional_parameters"] = extra
    if req.task_launcher_args:  # enroot + pyxis: the task starts inside the image; env with it
        params["srun_args"] = list(req.task_launcher_args)
        params["setup"] = list(s.setup) + pyxis.env_setup(req.env)
    ex.update_parameters(**params)
    return ex


class QueueWatch:
    """Says, once per change, why a Slurm job still waits in the queue (a drained node, too
    few resources...): a run that waits must never wait without a word. Asks squeue at most
    once per poll interval, and only until the job has started."""

    def __init__(self, key: str, job_id: str, poll_interval_s: float,
                 log: Callable[[str], None]) -> None:
        self.key, self.job_id, self.log = key, job_id, log
        self.every_s = max(1.0, poll_interval_s)
        self.next_at = 0.0
        self.said: str | None = None
        self.started = False

    def check(self) -> None:
        if self.started or time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.every_s
        state, reason = control.pending_reason(self.job_id)
        if state and state != "PENDING":
            self.started = True
            if self.said:
                self.log(f"[hopperlab] {self.key}: job {self.job_id} started ({state})")
            return
        if state == "PENDING" and reason and reason != self.said and reason != "None":
            self.said = reason
            hint = (" (the nodes it needs are drained, down or reserved: `sinfo -R` says why)"
                    if re.search(r"ReqNodeNotAvail|DRAIN|DOWN|Nodes required", reason) else "")
            self.log(f"[hopperlab] {self.key}: job {self.job_id} waits in the queue: "
                     f"{reason}{hint}")


class SlurmLauncher(Launcher):
    """Slurm's answers: jobs known by id (squeue, scancel), energy from sacct, nodes from
    sinfo."""

    timeout_states = TIMEOUT_STATES

    def make_executor(self, req: JobRequest, log: Callable[[str], None]) -> Executor:
        return make_executor(req, log)

    def refusal(self, exc: BaseException) -> str:
        """sbatch's own words (``sbatch: error: ...``), else the exception."""
        text = " ".join(str(exc).split())
        said = re.findall(r"sbatch: error: ([^\n]+?)(?= sbatch: error:|$)", text)
        return "; ".join(said) if said else f"{type(exc).__name__}: {text}"

    def check_reachable(self, source: str) -> None:
        control.check_scheduler(source)

    def check_partition(self, settings: Any, source: str) -> None:
        control.check_partition(source, getattr(settings, "partition", None))

    def watch(self, job: JobHandle, key: str, poll_interval_s: float,
              log: Callable[[str], None]) -> Callable[[], None] | None:
        return QueueWatch(key, str(job.job_id), poll_interval_s, log).check

    def given_up(self, job: JobHandle) -> str | None:
        """A job neither sacct nor squeue has known for ``UNKNOWN_STATE_LIMIT_S`` (accounting
        and controller both away): cancelled, and waited for no longer."""
        watcher = getattr(job, "watcher", None)
        unknown_s = getattr(watcher, "unknown_for_s", lambda _: 0.0)(str(job.job_id))
        if unknown_s < UNKNOWN_STATE_LIMIT_S:
            return None
        job.cancel(check=False)
        return (f"neither sacct nor squeue knew job {job.job_id} for {unknown_s:.0f} s; "
                f"stopped waiting and asked Slurm to cancel it")

    def container_task_args(self, image: str, binds: Sequence[str], workdir: str
                            ) -> list[str]:
        """pyxis's srun options: the image, its mounts, the working folder."""
        return pyxis.srun_args(image, binds, workdir=workdir)

    def container_refusal(self, runtime: str) -> str | None:
        if runtime == PYXIS and not pyxis.has_plugin(pyxis.srun_help()):
            return (f"pyxis, but `srun --help` here lists no {pyxis.IMAGE_OPTION}: the pyxis "
                    f"plugin is not loaded on this cluster (plugstack.conf)")
        return None

    def stop(self, job: JobHandle, poll_interval_s: float, limit_s: float | None) -> bool:
        """scancel, then wait until the job has left the queue (a job Slurm stops may take a
        while: ``CANCEL_WAIT_S`` at most)."""
        control.cancel(str(job.job_id))
        return control.wait_until_gone(str(job.job_id), min(2.0, poll_interval_s))

    def job_active(self, job_id: str) -> bool:
        return control.job_active(job_id)

    def cancel_job(self, job_id: str, poll_s: float) -> bool:
        control.cancel(job_id)
        return control.wait_until_gone(job_id, poll_s, CANCEL_WAIT_S)

    stop_words = ("DUE TO TIME LIMIT", "CANCELLED")

    def memory_kill(self, state: str, output: str) -> str | None:
        said = [ln.strip() for ln in output.splitlines() if MEMORY_KILL.search(ln)]
        word = state.split()[0].upper() if state.strip() else ""
        if word == "OUT_OF_MEMORY":
            return "Slurm ended the job OUT_OF_MEMORY" + (f": {said[-1][:300]}" if said else "")
        if said and word in ("CANCELLED", "FAILED", "UNKNOWN", ""):
            return f"Slurm killed the job for exceeding its memory limit: {said[0][:300]}"
        return None

    def node_failure(self, state: str) -> str | None:
        return "a node of the job failed (Slurm NODE_FAIL)" if state.startswith("NODE_FAIL") \
            else None

    def accounting(self, job_id: str) -> tuple[dict[str, float], dict[str, str]]:
        joules, note = energy.consumed_energy(job_id)
        return ({energy.METRIC: joules} if joules is not None else {}), {energy.TAG: note}

    def nodes_of(self, settings: Any, partition: str | None) -> list[str]:
        return nodes.partition_nodes(partition)

    def default_partition(self, settings: Any) -> str | None:
        return settings.partition if settings is not None else None

    def pinned(self, settings: Any, node: str) -> Any:
        s = settings or SlurmSettings()
        return replace(s, extra_sbatch={**s.extra_sbatch, "nodelist": node})


LAUNCHER = SlurmLauncher()
