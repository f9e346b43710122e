"""What the record says of a host-bound run's node (config/isolation.py): whether it ran alone
there, how, and why not when it did not. Locally the workflow gives such a run every one of its
cores (``Snakefile``: ``threads``), so Snakemake starts nothing beside it, and says so through
``ALONE_ENV``; a backend that isolates by itself (Slurm: an exclusive allocation) says how in
``BackendInfo.isolates``."""

from __future__ import annotations

import os
from typing import Any

from hopperlab.config.spec import RunSpec

#: set by the workflow's rule for a run it keeps alone: the cores it gave it (all of them)
ALONE_ENV = "HOPPERLAB_ALONE_CORES"


def isolation_of(spec: RunSpec) -> dict[str, Any]:
    """``{host_bound, isolated, how}`` of a host-bound run's record."""
    out: dict[str, Any] = {"host_bound": spec.host_bound}
    cores = os.environ.get(ALONE_ENV)
    if spec.site.backend.isolates:
        out.update(isolated=True, how=spec.site.backend.isolates)
    elif cores and spec.site.backend.job_handle == "process":
        out.update(isolated=True, how=f"alone on this node: the workflow gave it all {cores} "
                                      f"of its cores, so it started no other job beside it")
    else:
        out.update(isolated=False,
                   how=f"not isolated: run outside the workflow ({spec.site.executor} "
                       f"executor), nothing kept other jobs off the node")
    return out
