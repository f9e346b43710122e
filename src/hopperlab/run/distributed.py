"""One task of a run that spans several: who it is (the backend that started it says, in a
``JobEnvironment``: rank, world size, master address and port) and its torch.distributed
process group.

Every task derives the same master address and port from its backend's environment, so no task
needs to talk to another before ``init_process_group``. A collective timeout ends the run when
a rank dies instead of hanging.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Callable, Mapping

from hopperlab import backends
from hopperlab.backends.base import JobEnvironment
from hopperlab.config.spec import Resources
from hopperlab.core.errors import NodeError
from hopperlab.core.rundir import read_json, write_json_atomic
from hopperlab.run import ranks, stacks

#: where a per-rank path names its rank before the task knows it (profiler prefixes)
RANK_PLACEHOLDER = "{rank}"


def task_from_env(env: Mapping[str, str] | None = None) -> JobEnvironment:
    """This process's place in its job, as the backend that started it says
    (``backends.where_am_i``); a one-task job (or no scheduler) is world size 1."""
    return backends.where_am_i(os.environ if env is None else env)


def rank_from_env(env: Mapping[str, str] | None = None) -> int:
    return task_from_env(env).rank


def rank_dir(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / ranks.RANKS_DIR / str(rank)


def init_process_group(task: JobEnvironment, gpus: int, timeout_s: float) -> str:
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


def execute_rank(spec_path: str, task: JobEnvironment, run_one: Callable[..., dict[str, Any]]
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
    stacks.dump_on_term()  # a rank stopped while it hangs says where (its stderr, logs/)
    write_json_atomic(here / ranks.TASK_FILE,
                      {**task.task_record(), "host": socket.gethostname()})
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
