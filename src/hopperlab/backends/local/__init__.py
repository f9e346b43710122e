"""This machine, no scheduler: each job is a subprocess tree started by submitit's
LocalExecutor (its tasks on this one node), side by side as Snakemake schedules them."""

from __future__ import annotations

from hopperlab.backends.base import BackendInfo
from hopperlab.backends.local import jobenv

BACKEND = BackendInfo(
    name="local",
    summary="this machine: each job a subprocess (submitit's LocalExecutor)",
    executor="hopperlab.backends.local.executor",
    read_environment=jobenv.read,
    # submitit's local jobs may run on a node held through Slurm: they place their tasks
    detect_order=10,
    spans_nodes=False,
    multi_task=True,
    placement="on this one node",
    profiler_reach="here",
    job_handle="process",
    enforces_time_limit=False,
    poll_interval_s=0.5,
)
