"""Where a Slurm task is, from the variables Slurm sets (the only place that reads them).

``srun`` says who each task is in ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``/
``SLURM_JOB_NODELIST``; every task derives the same master address (the first node) and port
(from the job id) from those, so no task needs to talk to another before the rendezvous.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from hopperlab.backends.base import MASTER_PORT_ENV, JobEnvironment, port_from
from hopperlab.core.errors import NodeError


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu[03-05,7],cpu1`` -> ``gpu03``."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise NodeError(f"cannot read the Slurm node list {nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def slurm_count(text: str | None) -> int | None:
    """The first count of a Slurm CPU list: ``"16"``, ``"72(x2)"`` or ``"16,8"`` -> 16/72/16."""
    if not text:
        return None
    m = re.match(r"\s*(\d+)", text)
    return int(m.group(1)) if m and int(m.group(1)) > 0 else None


def cpus(environ: Mapping[str, str]) -> tuple[int | None, str]:
    """The CPUs Slurm gave this task: ``SLURM_CPUS_PER_TASK`` first, else this node's
    ``SLURM_JOB_CPUS_PER_NODE`` shared by its tasks (``SLURM_NTASKS_PER_NODE``)."""
    per_task = slurm_count(environ.get("SLURM_CPUS_PER_TASK"))
    if per_task:
        return per_task, "SLURM_CPUS_PER_TASK"
    per_node = slurm_count(environ.get("SLURM_JOB_CPUS_PER_NODE"))
    if per_node:
        tasks = slurm_count(environ.get("SLURM_NTASKS_PER_NODE")) or 1
        return (max(1, per_node // tasks),
                "SLURM_JOB_CPUS_PER_NODE" + (f"/{tasks} tasks" if tasks > 1 else ""))
    return None, ""


def identity(environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The Slurm job this process runs in, as the record keeps it (its ``slurm`` field)."""
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    return {"job_id": job_id, "array_job_id": environ.get("SLURM_ARRAY_JOB_ID"),
            "node": environ.get("SLURMD_NODENAME"),
            "partition": environ.get("SLURM_JOB_PARTITION"), "state": "RUNNING"}


def read(environ: Mapping[str, str]) -> JobEnvironment | None:
    """This process inside a Slurm job (None: not in one). A task that ``srun`` started knows
    its place; a process of the allocation otherwise is one task that Slurm gave CPUs (a
    count without a job id is taken as well: whoever set it meant the allocation)."""
    record = identity(environ)
    count, source = cpus(environ)
    if record is None and count is None:
        return None
    given: dict[str, Any] = {"job_id": record["job_id"] if record else None, "cpus": count,
             "cpus_source": source, "record": record}
    if record is None or "SLURM_PROCID" not in environ or "SLURM_NTASKS" not in environ:
        return JobEnvironment(**given, launcher="none")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or "127.0.0.1"
    return JobEnvironment(
        rank=int(environ["SLURM_PROCID"]), world_size=int(environ["SLURM_NTASKS"]),
        local_rank=int(environ.get("SLURM_LOCALID", 0)),
        node_rank=int(environ.get("SLURM_NODEID", 0)),
        nodes=int(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or 1),
        master_addr=first_host(nodelist),
        master_port=int(environ.get(MASTER_PORT_ENV) or port_from(str(record["job_id"]))),
        launcher="slurm", **given)
