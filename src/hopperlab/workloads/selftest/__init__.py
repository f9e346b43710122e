"""selftest: trivial runs that exercise the platform itself, not the hardware.

Used to measure the platform's own cost per run (benchmarks/platform.py) and to check how it
handles faults for real: a job that raises, that runs out of memory, that outlives its time
limit. Not part of the default matrix (configs/config.yaml ``families``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from hopperlab.core.schema import bounded, settle_fields
from hopperlab.workloads.base import FamilyInfo

Action = Literal["ok", "raise", "oom", "sleep", "skip", "read-table", "collective",
                 "exhaust-memory", "stuck"]
ACTIONS = get_args(Action)


@dataclass(frozen=True)
class SelftestParams:
    #: ok: log steps and finish; raise: a bug (RuntimeError); oom: MemoryError;
    #: sleep: sleep ``sleep_s`` (for time limits and cancels); skip: SkipRun;
    #: stuck: sleep ``sleep_s`` with SIGINT and SIGTERM blocked, as a job stuck in a driver call
    #: that never returns to Python: only SIGKILL ends it (for the GPU scripts' bounds);
    #: read-table: count the rows of the run's ``table`` asset (the asset wiring, end to end);
    #: exhaust-memory: print a warning, then fill ``exhaust_gib`` GiB of host memory page by
    #: page (under a memory cap the kernel kills the job: a host OOM kill, for real);
    action: Action = "ok"
    steps: int = bounded(3, at_least=0)
    sleep_s: float = bounded(0.0, at_least=0)
    exhaust_gib: float = bounded(1.0, at_least=0)
    #: collective: all-reduce once per step over the run's ranks, each after ``sleep_s``;
    #: ``fail_rank`` raises at ``fail_step`` (-1: none), for the distributed fault path
    fail_rank: int = -1
    fail_step: int = 1
    #: collective: rank ``hang_rank`` stops answering at ``fail_step`` (sleeps, outside any
    #: collective, until the job is ended), for a hung rank (-1: none)
    hang_rank: int = -1
    #: ok: the relative standard deviation of ``value`` (normal, seeded by ``seed`` and the
    #: repeat), so that repeats and references can be exercised with known noise
    jitter: float = bounded(0.0, at_least=0)
    seed: int = 0
    #: ok: ``value`` is 10 % lower while this file exists (``{node}`` in it: the Slurm node the
    #: job runs on): a node slowed by a second process, for the CPU tests of
    #: benchmarks/noise_gpu.py and ``check --every-node`` ("": never)
    slow_while: str = ""
    #: comma-separated environment variables the run records as tags ``selftest.env.<NAME>``
    #: (unset: ``<unset>``): what a job's environment really held
    env_names: str = ""

    def __post_init__(self) -> None:
        settle_fields(self)  # every bound is declared on its field


FAMILY = FamilyInfo(
    name="selftest",
    entry="hopperlab.workloads.selftest.workload:run",
    supported_knobs={"profiler": frozenset({"none"})},
    params=SelftestParams,
    headline_metrics=("value",),
    directions={"value": "higher"},
    judged=("value",),
)
