"""Where a task of submitit's LocalExecutor is: ``SUBMITIT_LOCAL_*`` (its place) and the port
the submitting process found free (``MASTER_PORT_ENV``); the master is this node."""

from __future__ import annotations

from typing import Mapping

from hopperlab.backends.base import MASTER_PORT_ENV, JobEnvironment, port_from


def read(environ: Mapping[str, str]) -> JobEnvironment | None:
    if "SUBMITIT_LOCAL_NTASKS" not in environ or "SUBMITIT_LOCAL_GLOBALID" not in environ:
        return None
    job_id = environ.get("SUBMITIT_LOCAL_JOB_ID", "0")
    port = environ.get(MASTER_PORT_ENV) or str(port_from(job_id))
    rank = int(environ["SUBMITIT_LOCAL_GLOBALID"])
    return JobEnvironment(rank=rank, world_size=int(environ["SUBMITIT_LOCAL_NTASKS"]),
                          local_rank=int(environ.get("SUBMITIT_LOCAL_LOCALID", rank)),
                          node_rank=0, nodes=1, master_addr="127.0.0.1", master_port=int(port),
                          launcher="local", job_id=job_id)
