"""Submitting on this machine through submitit's LocalExecutor.

The time limit is ours to enforce (``enforces_time_limit`` is False): the controller's own
limit lies ``BACKSTOP_MIN`` past it and only stops orphans, since its SIGINT would read as a
crash ("KeyboardInterrupt"). submitit is imported inside functions.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any, Callable

from hopperlab.backends.base import MASTER_PORT_ENV, Executor, JobHandle, JobRequest, Launcher
from hopperlab.backends.local import slots
from hopperlab.node import oom_kills

#: the local controller's own limit lies this far past ours (minutes)
BACKSTOP_MIN = 1
#: how long a job waits for GPU slots that other jobs of this node hold
SLOT_WAIT_S = 6 * 3600.0
#: where submitit's local controller writes its own stderr (in the job's submitit folder)
CONTROLLER_ERR = "controller.err"


def caller_gpus(visible: str | None) -> tuple[int, ...]:
    """The GPU indices this process was given (``CUDA_VISIBLE_DEVICES``, indices only): a job
    takes its GPUs from them, so that two workflows pinned to GPU 0 and GPU 1 of one node run
    side by side (submitit would give both GPU 0). Unset, empty, UUIDs or ``-1``: () (submitit's
    own numbering from 0)."""
    words = [w.strip() for w in (visible or "").split(",") if w.strip()]
    if not words or not all(w.isdigit() for w in words):
        return ()
    return tuple(int(w) for w in words)


def job_gpus(n: int, log: Callable[[str], None] = print) -> tuple[int, ...]:
    """The GPUs a job of ``n`` gets: its own slots of the node's pool (``slots``: no other
    job of this node holds them while it runs), else the caller's ``CUDA_VISIBLE_DEVICES``
    (a node whose pool is empty: submitit numbers from 0)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    indices = slots.pool(visible, os.environ.get(slots.SLOTS_ENV))
    if not n or not indices or n > len(indices):  # more than the pool: submitit refuses
        return caller_gpus(visible)
    got = slots.take(n, indices, timeout_s=SLOT_WAIT_S)
    log(f"[hopperlab] GPU slot(s) {','.join(map(str, got))} of {len(indices)}")
    return got


def free_port() -> int:
    """A port free on this node now (the local submitter hands it to every task)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalLauncher(Launcher):
    def __init__(self) -> None:
        self._task_pids: dict[str, set[int]] = {}

    def make_executor(self, req: JobRequest, log: Callable[[str], None]) -> Executor:
        import submitit

        res = req.resources
        ex = submitit.LocalExecutor(folder=req.folder, python=req.python, max_num_timeout=0)
        if res.distributed:  # every task of this job reads the port this process found free
            os.environ[MASTER_PORT_ENV] = str(free_port())
        ex.update_parameters(timeout_min=res.time_min + BACKSTOP_MIN, gpus_per_node=res.gpus,
                             tasks_per_node=res.tasks_on_node, nodes=1, signal_delay_s=0,
                             visible_gpus=job_gpus(res.gpus, log))
        return ex

    def submit(self, executor: Executor, func: Callable[..., Any], *args: Any) -> JobHandle:
        """Start the job with submitit's controller writing its own stderr into the job's
        submitit folder (``controller.err``): stopped (Ctrl-C, a time limit), it dies of
        KeyboardInterrupt with a traceback that is no news to the user, who is told why the
        run stopped. The tasks' output goes to their own log files as before."""
        folder = Path(executor.folder)  # type: ignore[attr-defined]  # submitit LocalExecutor
        folder.mkdir(parents=True, exist_ok=True)
        sys.stderr.flush()
        saved = os.dup(2)
        target = os.open(folder / CONTROLLER_ERR, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.dup2(target, 2)  # the controller inherits this fd 2 at its start
            return executor.submit(func, *args)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(target)

    def watch(self, job: JobHandle, key: str, poll_interval_s: float,
              log: Callable[[str], None]) -> Callable[[], None] | None:
        """Note the job's task processes at each poll (the children of submitit's controller,
        whose pid is the job id): the kernel names the one it kills by its pid."""
        pids = self._task_pids.setdefault(str(job.job_id), set())

        folder = Path(job.paths.stdout).parent

        def note() -> None:  # and the tasks a warm starter forked for them (run/warm.py)
            pids.update(oom_kills.children(int(job.job_id)))
            pids.update(oom_kills.stand_ins(folder))

        note()
        return note

    def kernel_memory_kill(self, job: JobHandle, before: Any) -> str | None:
        """The kernel log's "Killed process <pid>" line for a task of the job (SIGKILL by the
        out-of-memory killer), with the rise of its ``oom_kill`` counters."""
        pids = self._task_pids.pop(str(job.job_id), set())
        pids |= oom_kills.stand_ins(Path(job.paths.stdout).parent)
        lines = oom_kills.kernel_kill_lines(pids)
        if not lines:
            return None
        counted = oom_kills.kernel_oom_kill(before, oom_kills.read_counts())
        return f"SIGKILL; the kernel: {lines[-1][:300]}" + (f"; {counted}" if counted else "")


LAUNCHER = LocalLauncher()
