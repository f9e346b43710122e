"""One task of a run that spans several: who it is (from the scheduler's environment) and its
torch.distributed process group.

Slurm starts the tasks of a job (``srun``, through submitit) and says who each is in
``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``/``SLURM_JOB_NODELIST``; submitit's local
executor starts them on this node and says it in ``SUBMITIT_LOCAL_*``. Every task derives the
same master address and port from those, so no task needs to talk to another before
``init_process_group``. A collective timeout ends the run when a rank dies instead of hanging.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from hopperlab.config.spec import Resources
from hopperlab.core.errors import NodeError
from hopperlab.core.rundir import read_json, write_json_atomic
from hopperlab.run import ranks

#: the variable the local submitter sets to a port it found free (every task reads it)
MASTER_PORT_ENV = "HOPPERLAB_MASTER_PORT"
#: where a per-rank path names its rank before the task knows it (profiler prefixes)
RANK_PLACEHOLDER = "{rank}"
PORT_RANGE = (20000, 60000)


@dataclass(frozen=True)
class Task:
    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    nodes: int
    master_addr: str
    master_port: int
    launcher: str  # slurm | local | none


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu[03-05,7],cpu1`` -> ``gpu03``."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise NodeError(f"cannot read the Slurm node list {nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def _port_from(job_id: str) -> int:
    lo, hi = PORT_RANGE
    digits = int(re.sub(r"\D", "", job_id) or "0")
    return lo + digits % (hi - lo)


def task_from_env(env: Mapping[str, str] | None = None) -> Task:
    """This process's place in its job; a one-task job (or no scheduler) is world size 1."""
    env = os.environ if env is None else env
    if "SUBMITIT_LOCAL_NTASKS" in env and "SUBMITIT_LOCAL_GLOBALID" in env:
        port = env.get(MASTER_PORT_ENV) or str(_port_from(env.get("SUBMITIT_LOCAL_JOB_ID", "0")))
        rank = int(env["SUBMITIT_LOCAL_GLOBALID"])
        return Task(rank=rank, world_size=int(env["SUBMITIT_LOCAL_NTASKS"]),
                    local_rank=int(env.get("SUBMITIT_LOCAL_LOCALID", rank)), node_rank=0,
                    nodes=1, master_addr="127.0.0.1", master_port=int(port), launcher="local")
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "SLURM_JOB_ID" in env:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1"
        return Task(rank=int(env["SLURM_PROCID"]), world_size=int(env["SLURM_NTASKS"]),
                    local_rank=int(env.get("SLURM_LOCALID", 0)),
                    node_rank=int(env.get("SLURM_NODEID", 0)),
                    nodes=int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1),
                    master_addr=first_host(nodelist),
                    master_port=int(env.get(MASTER_PORT_ENV) or _port_from(env["SLURM_JOB_ID"])),
                    launcher="slurm")
    return Task(0, 1, 0, 0, 1, "127.0.0.1", 0, "none")


def rank_from_env(env: Mapping[str, str] | None = None) -> int:
    return task_from_env(env).rank


def free_port() -> int:
    """A port free on this node now (the local submitter hands it to every task)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_dir(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / ranks.RANKS_DIR / str(rank)


def init_process_group(task: Task, gpus: int, timeout_s: float) -> str:
    """Join the run's process group (NCCL on GPUs, gloo on CPU); return the backend."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR=task.master_addr, MASTER_PORT=str(task.master_port),
                      RANK=str(task.rank), WORLD_SIZE=str(task.world_size),
                      LOCAL_RANK=str(task.local_rank))
    backend = "gloo"
    if gpus > 0 and torch.cuda.is_available():
        backend = "nccl"
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        torch.cuda.set_device(task.local_rank % torch.cuda.device_count())
    dist.init_process_group(backend=backend, rank=task.rank, world_size=task.world_size,
                            timeout=timedelta(seconds=timeout_s))
    return backend


def execute_rank(spec_path: str, task: Task, run_one: Callable[..., dict[str, Any]]
                 ) -> dict[str, Any]:
    """Run one rank: join the group, run the workload into ``ranks/<r>/`` through the runner's
    ``run_one(spec_path, run_dir=...)``, then (all ranks done) rank 0 writes the run's record.

    A rank that raises re-raises (its record says ``failed`` with its traceback); its peers
    then fail in their next collective (the peer is gone, or the timeout), and the submitting
    side merges the ranks' records into the run's (``ranks.merged_record``).
    """
    import torch.distributed as dist

    spec_data = read_json(Path(spec_path))
    run_dir = Path(spec_path).parent
    res = Resources(**spec_data["resources"])
    if res.world_size != task.world_size:
        raise NodeError(f"{spec_data.get('key')}: the scheduler started {task.world_size} tasks "
                        f"({task.launcher}), the spec asks for {res.world_size}")
    here = rank_dir(run_dir, task.rank)
    here.mkdir(parents=True, exist_ok=True)
    write_json_atomic(here / ranks.TASK_FILE, {**task.__dict__, "host": socket.gethostname()})
    backend = init_process_group(task, res.gpus, res.collective_timeout_s)
    os.environ["HOPPERLAB_BACKEND"] = backend
    rec = run_one(spec_path, run_dir=str(here))  # raises when the workload did
    if rec.get("status") != "ok":
        dist.destroy_process_group()
        return rec
    dist.barrier()  # every rank has written its record
    if task.rank == 0:
        merged = ranks.merged_record(run_dir, rec.get("attempt", 1), res.world_size)
        if merged is not None:
            ranks.write_run_files(run_dir, merged)
            rec = merged
    dist.barrier()
    dist.destroy_process_group()
    return rec
