"""What a scheduler backend declares (``BackendInfo``), what a job asks of it on its node
(``JobEnvironment``: where am I) and what the submitting side hands it (``JobRequest``) and
asks of it (``Launcher``).

A backend is a folder ``backends/<name>/``: its ``__init__`` declares ``BACKEND`` (cheap: no
submitit), its ``jobenv`` reads the job's environment on the node, its ``executor`` (loaded by
name only when a job is submitted) makes the submitit executor and answers the scheduler's
questions. Everything outside asks the declaration (``spans_nodes``, ``in_process``...), never
compares a backend's name.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Protocol, Sequence

from hopperlab.core.errors import NodeError

#: the variable the local submitter sets to a port it found free (every task reads it)
MASTER_PORT_ENV = "HOPPERLAB_MASTER_PORT"
#: the ports a job's tasks derive their rendezvous port from (no task talks to another first)
PORT_RANGE = (20000, 60000)
#: how long a cancelled job may take to leave the scheduler before we stop waiting for it
CANCEL_WAIT_S = 120.0


class SchedulerDown(NodeError):
    """The site's scheduler cannot take jobs from this machine."""


def port_from(job_id: str) -> int:
    """The rendezvous port every task of job ``job_id`` derives alike."""
    lo, hi = PORT_RANGE
    digits = int(re.sub(r"\D", "", job_id) or "0")
    return lo + digits % (hi - lo)


@dataclass(frozen=True)
class JobEnvironment:
    """Where this process is: its task in the job, and what the scheduler gave it (submitit's
    ``JobEnvironment``, with the CPUs and the scheduler's record of the job beside it).

    ``cpus`` (None: the scheduler does not say) comes with ``cpus_source``, the words the
    thread plan records; ``record`` is what the run's record keeps of the scheduler's job (its
    ``slurm`` field; None outside a scheduler's job)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    node_rank: int = 0
    nodes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    #: the backend that started this task (``none``: nobody, a plain process)
    launcher: str = "none"
    job_id: str | None = None
    cpus: int | None = None
    cpus_source: str = ""
    record: dict[str, Any] | None = None

    def task_record(self) -> dict[str, Any]:
        """The task's place, as each rank writes it (``ranks/<r>/task.json``)."""
        return {"rank": self.rank, "world_size": self.world_size, "local_rank": self.local_rank,
                "node_rank": self.node_rank, "nodes": self.nodes,
                "master_addr": self.master_addr, "master_port": self.master_port,
                "launcher": self.launcher}


#: what a backend's ``jobenv`` answers: its reading of the environment, None when the
#: environment is not of its making
EnvReader = Callable[[Mapping[str, str]], "JobEnvironment | None"]


@dataclass(frozen=True)
class BackendInfo:
    """A scheduler backend as the rest of hopperlab sees it (``backends/<name>/__init__.py``)."""

    name: str
    summary: str
    #: the module (loaded by name, only to submit) whose ``LAUNCHER`` is a ``Launcher``
    executor: str
    #: reads a job's environment on its node (``backends/<name>/jobenv.py``)
    read_environment: EnvReader
    #: earlier answers first: a backend whose jobs may run inside another's (submitit's local
    #: jobs on a node held through Slurm) answers before it
    detect_order: int = 50
    #: the site file's block of this backend's settings (a frozen dataclass; None: none)
    settings: type | None = None
    #: the key of that block in the site file (default: the backend's name)
    settings_key: str | None = None
    #: the settings that change what a run produces (its fingerprint; not accounts or prices)
    result_keys: tuple[str, ...] = ()
    #: can a job span several nodes / run several tasks
    spans_nodes: bool = False
    multi_task: bool = True
    #: runs the job in the submitting process (nothing to wait for, no command line to wrap)
    in_process: bool = False
    #: where its jobs run, as error messages say it
    placement: str = "on this one node"
    #: how a profiler (nsys) reaches the job: "here" (this machine's nsys), "node" (the node's
    #: PATH, the image, or the settings' setup lines), "none" (in-process: nothing to wrap)
    profiler_reach: Literal["here", "node", "none"] = "here"
    #: shell lines run on the node before the job (from the settings; may put nsys on PATH)
    node_setup: Callable[[Any], tuple[str, ...]] = lambda settings: ()
    #: what a job's id names, for the attempt history and the record: "scheduler" (a job the
    #: scheduler knows by id: recorded, asked about, cancelled by id), "process" (a process on
    #: this host), "none"
    job_handle: Literal["scheduler", "process", "none"] = "none"
    #: the scheduler enforces the time limit (else hopperlab stops the job at its limit)
    enforces_time_limit: bool = False
    #: can send a job to one named node (``hopperlab check --every-node``)
    pins_nodes: bool = False
    #: seconds between job-state polls when the site does not say
    poll_interval_s: float = 0.5
    #: how it keeps a host-bound job alone on its node (config/isolation.py), as the record
    #: says it; None: by itself it cannot (the workflow's cores do it for a local job)
    isolates: str | None = None
    #: what of the run's record it fills (the record's scheduler field keeps the name ``slurm``
    #: for the records and MLflow tags already written; its accounting's metrics and tags)
    record_fields: tuple[str, ...] = ()

    @property
    def site_key(self) -> str | None:
        return (self.settings_key or self.name) if self.settings is not None else None

    def default_settings(self) -> Any:
        return self.settings() if self.settings is not None else None


@dataclass(frozen=True)
class JobResources:
    """What a job asks for (``config.spec.Resources`` resolved): ``cpus`` and ``mem_gb`` per
    task, ``gpus`` per node."""

    gpus: int
    cpus: int
    mem_gb: float
    time_min: int
    nodes: int
    tasks_on_node: int

    @property
    def distributed(self) -> bool:
        return self.nodes * self.tasks_on_node > 1


@dataclass(frozen=True)
class JobRequest:
    """One job, as the submitting side hands it to a backend's executor."""

    key: str
    name: str
    #: where submitit keeps the job's files (run_dir/submitit)
    folder: Path
    #: the command that replaces submitit's python (container and profiler prefixes included)
    python: str
    resources: JobResources
    #: the backend's settings from the site (its dataclass; None: it has none)
    settings: Any
    poll_interval_s: float
    #: the site's ``env:`` (a launcher that starts the task elsewhere carries it there)
    env: Mapping[str, str] = field(default_factory=dict)
    #: options for the launcher of each task (pyxis: the image, mounts, working folder)
    task_launcher_args: tuple[str, ...] = ()
    source: str = ""
    #: the job needs its node(s) to itself (a host-bound run: config/isolation.py)
    exclusive: bool = False


class JobPaths(Protocol):
    """Where a job's output lands (submitit's ``JobPaths``)."""

    @property
    def stdout(self) -> Path: ...
    @property
    def stderr(self) -> Path: ...


class JobHandle(Protocol):
    """A submitted job as the submitting side holds it (submitit's ``Job``, whatever the
    backend): waited on, asked for its state and result, cancelled."""

    @property
    def job_id(self) -> str: ...
    @property
    def paths(self) -> JobPaths: ...
    @property
    def state(self) -> str: ...
    def done(self, force_check: bool = False) -> bool: ...
    def cancel(self, check: bool = True) -> Any: ...
    def result(self) -> Any: ...
    def results(self) -> list[Any]: ...


class Executor(Protocol):
    """What a backend's ``make_executor`` returns (a submitit executor): it submits one call."""

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JobHandle: ...


class Launcher:
    """What the submitting side does through a backend; the defaults suit a job that is a
    process of this host (submitit's job object knows how to stop it)."""

    #: the end states that mean "ran out of its time limit" (``TIMEOUT`` is also what
    #: hopperlab says when it stops a job at the limit itself)
    timeout_states: frozenset[str] = frozenset({"TIMEOUT"})

    def make_executor(self, req: JobRequest, log: Callable[[str], None]) -> Executor:
        raise NotImplementedError

    def refusal(self, exc: BaseException) -> str:
        """What the scheduler said when it refused a job, in one line."""
        return f"{type(exc).__name__}: {' '.join(str(exc).split())}"

    def submit(self, executor: Executor, func: Callable[..., Any], *args: Any) -> JobHandle:
        """Hand ``func(*args)`` to the submitit ``executor``; returns its job."""
        return executor.submit(func, *args)

    def check_reachable(self, source: str) -> None:
        """Raise (naming ``source``) when the scheduler cannot take a job from here."""

    def check_partition(self, settings: Any, source: str) -> None:
        """Raise (naming ``source``) when the site's settings name a partition (queue) the
        scheduler does not have; nothing to check by default."""

    def watch(self, job: JobHandle, key: str, poll_interval_s: float,
              log: Callable[[str], None]) -> Callable[[], None] | None:
        """A check run at each poll while the job of run ``key`` waits (None: nothing to
        watch)."""
        return None

    def given_up(self, job: JobHandle) -> str | None:
        """Why to stop waiting for ``job`` now (its state has been unknown too long: the job is
        cancelled and the reason returned); None: keep waiting."""
        return None

    def container_task_args(self, image: str, binds: Sequence[str], workdir: str
                            ) -> list[str]:
        """Options that start each task inside ``image`` (pyxis: srun's); a backend without
        such a launcher cannot run a site whose container runtime needs one."""
        raise NodeError(f"{type(self).__name__}: no task launcher that starts a container "
                        f"image (a pyxis site needs executor: slurm)")

    def container_refusal(self, runtime: str) -> str | None:
        """Why this machine cannot submit jobs in a container of ``runtime`` through this
        backend (pyxis: srun lists no --container-image), or None."""
        return None

    def stop(self, job: JobHandle, poll_interval_s: float, limit_s: float | None) -> bool:
        """Cancel ``job`` and wait until it has ended (``limit_s`` None: however long that
        takes); False when it still ran at the limit."""
        job.cancel(check=False)
        deadline = None if limit_s is None else time.monotonic() + limit_s
        while not job.done():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def job_active(self, job_id: str) -> bool:
        """Whether the scheduler still runs (or will run) the job ``job_id``."""
        return False

    def cancel_job(self, job_id: str, poll_s: float) -> bool:
        """Cancel the job ``job_id`` by its id; True once it has left the scheduler."""
        return True

    def memory_kill(self, state: str, output: str) -> str | None:
        """Why the scheduler killed the job for its memory, from the job's end ``state`` and
        its ``output`` (stderr, then stdout); None when it did not (the default: a process of
        this host that runs out of memory raises MemoryError itself)."""
        return None

    def kernel_memory_kill(self, job: JobHandle, before: Any) -> str | None:
        """The kernel's word that it killed a process of ``job`` for memory since ``before``
        (``node.oom_kills.read_counts()`` at submission), where the job runs on this host;
        None otherwise (the default: the scheduler says it, ``memory_kill``)."""
        return None

    def node_failure(self, state: str) -> str | None:
        """The scheduler's word that a node of the job failed (its ranks only saw a peer go),
        or None."""
        return None

    #: words of the scheduler's own in a job's output when it stopped the job (the line the
    #: record's reason quotes when the job left no record)
    stop_words: tuple[str, ...] = ()

    def accounting(self, job_id: str) -> tuple[dict[str, float], dict[str, str]]:
        """(metrics, tags) the scheduler's accounting adds to the job's record (Slurm: the
        job's energy); nothing by default."""
        return {}, {}

    def nodes_of(self, settings: Any, partition: str | None) -> list[str]:
        """The usable nodes a job can be pinned to (``pins_nodes`` backends)."""
        raise NotImplementedError

    def default_partition(self, settings: Any) -> str | None:
        return None

    def pinned(self, settings: Any, node: str) -> Any:
        """``settings`` that send every job to ``node``."""
        raise NotImplementedError
