"""Slurm through submitit's SlurmExecutor: jobs on the cluster's nodes, one ``srun`` task per
rank, states from sacct (squeue when accounting is away), pyxis containers through ``srun``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hopperlab.backends.base import BackendInfo
from hopperlab.backends.slurm import jobenv


@dataclass(frozen=True)
class SlurmSettings:
    """The site's ``slurm:`` block."""

    #: sbatch --partition, --account, --qos, --constraint (None: the cluster's default)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    #: more sbatch options, e.g. {exclusive: true, reservation: hopper}
    extra_sbatch: dict[str, Any] = field(default_factory=dict)
    #: shell lines run in the job before python (module load ..., export ...)
    setup: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, value in self.extra_sbatch.items():
            if not isinstance(name, str) or not isinstance(value, (str, int, bool)):
                raise ValueError(f"extra_sbatch.{name}: expected a string, a whole number or "
                                 f"true/false, got {value!r}")


BACKEND = BackendInfo(
    name="slurm",
    summary="a Slurm cluster (submitit's SlurmExecutor; sacct, squeue)",
    executor="hopperlab.backends.slurm.executor",
    read_environment=jobenv.read,
    detect_order=20,
    settings=SlurmSettings,
    result_keys=("partition", "qos", "constraint", "extra_sbatch", "setup"),
    spans_nodes=True,
    multi_task=True,
    placement="on the cluster's nodes",
    profiler_reach="node",
    node_setup=lambda settings: tuple(settings.setup) if settings is not None else (),
    job_handle="scheduler",
    isolates="an exclusive Slurm allocation (sbatch --exclusive): no other job on its node",
    enforces_time_limit=True,
    pins_nodes=True,
    poll_interval_s=30.0,
    record_fields=("slurm", "metrics.energy_slurm_job_j", "tags.energy.slurm"),
)
