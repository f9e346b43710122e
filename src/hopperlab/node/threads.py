"""Thread pools sized from the CPUs the job was given, not from the node's total.

A GH200 node has 72 Grace cores and an x86 node often more; a job that Slurm gave 8 of them but
whose OpenMP, MKL, torch intra-op pool, data loader and DuckDB each start one thread per core of
the node oversubscribes its own allocation many times over (source 002: thread scaling by core
count). ``cpus_given`` reads what the job really has (the scheduler's allocation, as the job's backend
read it, bounded by the process affinity that the kernel enforces); ``plan_threads`` turns it into pool sizes, which a site or a
variant may override (``resources.threads``); ``apply`` sets them before the workload starts.
Nothing here imports torch: ``apply`` only touches it when the job already imported it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, MutableMapping

#: the pools a site or a variant may size (``resources.threads``)
POOLS = ("intra_op", "dataloader_workers", "duckdb")
#: environment variables that size the BLAS/OpenMP pools (read when a library first starts)
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: where the job reads its DuckDB thread count and its data-loader worker ceiling
DUCKDB_ENV = "HOPPERLAB_DUCKDB_THREADS"
WORKERS_ENV = "HOPPERLAB_DATALOADER_WORKERS"
#: what a launcher may leave in a job's environment: Snakemake's ``shell:`` exports these (and
#: the THREAD_ENV ones) as the rule's ``threads``, 1 by default, to every job it starts
LAUNCHER_ENV = ("GOTO_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


@dataclass(frozen=True)
class ThreadPlan:
    """How many threads each pool gets, and where the CPU count came from."""

    cpus: int
    source: str
    intra_op: int
    dataloader_workers: int
    duckdb: int
    overridden: tuple[str, ...] = ()

    def as_record(self) -> dict[str, Any]:
        d = asdict(self)
        d["overridden"] = list(self.overridden)
        return d


def cpus_given(given: tuple[int, str] | None, affinity: Iterable[int] | None,
               requested: int | None = None) -> tuple[int, str]:
    """(CPUs this process may use, how that was found).

    The scheduler's count first (``given``: what the job's backend read, e.g. Slurm's
    ``SLURM_CPUS_PER_TASK``, with its words), bounded by the affinity mask, which is what the
    kernel enforces (with ``TaskPlugin=task/none`` it is the whole node, hence the scheduler
    first). Without one: the run's ``requested`` CPUs (its ``resources.cpus``) bounded by the
    affinity mask. Why: the local executor starts jobs side by side as Snakemake schedules them
    (one CPU each at smoke); sized from the whole mask, two jobs put four OpenMP threads on two
    cores, and OpenMP's spinning barriers made steps 10-30x slower whenever the cores were
    shared.
    """
    n_aff = len(set(affinity)) if affinity is not None else None
    sched, source = given if given else (None, "")
    if sched is not None and n_aff is not None and n_aff < sched:
        return n_aff, f"affinity ({n_aff} CPUs, below {source}={sched})"
    if sched is not None:
        return sched, source
    if requested and n_aff and requested < n_aff:
        return requested, f"resources.cpus ({n_aff} CPUs in the affinity mask)"
    if n_aff:
        return n_aff, "affinity"
    return max(1, os.cpu_count() or 1), "os.cpu_count"


def plan_threads(cpus: int, source: str, overrides: Mapping[str, Any] | None = None) -> ThreadPlan:
    """Pool sizes for ``cpus``: every CPU for compute (intra-op, DuckDB), one left to the main
    process beside the data-loader workers; ``overrides`` (pool -> count) win."""
    if cpus < 1:
        raise ValueError(f"cpus must be at least 1, got {cpus}")
    sizes = {"intra_op": cpus, "dataloader_workers": max(0, cpus - 1), "duckdb": cpus}
    given = dict(overrides or {})
    unknown = sorted(set(given) - set(POOLS))
    if unknown:
        raise ValueError(f"threads: unknown pool(s) {', '.join(unknown)} "
                         f"(known: {', '.join(POOLS)})")
    for name, value in given.items():
        least = 0 if name == "dataloader_workers" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"threads.{name}: expected a whole number of at least {least}, "
                             f"got {value!r}")
        sizes[name] = value
    return ThreadPlan(cpus=cpus, source=source, overridden=tuple(sorted(given)), **sizes)


def apply(plan: ThreadPlan, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Size the pools: the OpenMP/MKL/OpenBLAS variables (unless the environment already sets
    them: a site's ``env`` wins), the variables the families read, and torch's intra-op pool
    when torch is already imported. Returns what was set."""
    env = os.environ if environ is None else environ
    set_now: dict[str, str] = {}
    for name in THREAD_ENV:
        if name not in env:
            env[name] = set_now[name] = str(plan.intra_op)
    env[DUCKDB_ENV] = set_now[DUCKDB_ENV] = str(plan.duckdb)
    env[WORKERS_ENV] = set_now[WORKERS_ENV] = str(plan.dataloader_workers)
    torch = sys.modules.get("torch")
    if torch is not None and environ is None:
        torch.set_num_threads(int(env.get("OMP_NUM_THREADS", plan.intra_op)))
    return set_now


def drop_inherited(keep: Iterable[str], environ: MutableMapping[str, str] | None = None
                   ) -> dict[str, str]:
    """Take out the pool sizes the job inherited from whatever started it, except those in
    ``keep`` (the site's ``env:``, which ``apply`` then honours); returns what was taken out.

    Why: Snakemake's ``shell:`` sets OMP_NUM_THREADS=1 (the rule's threads) for every job;
    ``apply`` kept it, torch ran one thread while the record said 16, and the 13B offload rows'
    CPU AdamW and host triad ran at a single core's rate (issue 35)."""
    env = os.environ if environ is None else environ
    kept = set(keep)
    dropped = {}
    for name in (*THREAD_ENV, *LAUNCHER_ENV):
        if name in env and name not in kept:
            dropped[name] = env.pop(name)
    return dropped


def job_threads(overrides: Mapping[str, Any] | None = None, requested: int | None = None,
                given: tuple[int, str] | None = None) -> ThreadPlan:
    """The plan of this process: the scheduler's count (``given``), its affinity mask and
    requested CPUs."""
    try:
        affinity: Iterable[int] | None = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        affinity = None
    cpus, source = cpus_given(given, affinity, requested)
    return plan_threads(cpus, source, overrides)


def env_threads(name: str, default: int | None = None) -> int | None:
    """A pool size ``apply`` left in the environment (``DUCKDB_ENV``, ``WORKERS_ENV``)."""
    value = os.environ.get(name)
    return int(value) if value and value.isdigit() else default
