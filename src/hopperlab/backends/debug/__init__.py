"""In this process (submitit's DebugExecutor): the run is a function call of the submitting
process, one task, nothing to queue or wait for. What ``hopperlab run`` uses, and what a site
may name to run every job in the workflow's own processes (no subprocess, no scheduler)."""

from __future__ import annotations

from hopperlab.backends.base import BackendInfo
from hopperlab.backends.debug import jobenv

BACKEND = BackendInfo(
    name="debug",
    summary="in this process (submitit's DebugExecutor): one task, no command line",
    executor="hopperlab.backends.debug.executor",
    read_environment=jobenv.read,
    detect_order=90,
    spans_nodes=False,
    multi_task=False,
    in_process=True,
    placement="in-process",
    profiler_reach="none",
    job_handle="none",
    enforces_time_limit=False,
    poll_interval_s=0.5,
)
