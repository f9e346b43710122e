"""The selftest workload: does exactly what its ``action`` says, and nothing heavy."""

from __future__ import annotations

import os
import time
from typing import Any

from hopperlab.core.rundir import SkipRun
from hopperlab.workloads.base import Recording, RunView


def run(spec: RunView, recorder: Recording) -> None:
    p = spec.params
    for name in filter(None, (n.strip() for n in p.env_names.split(","))):
        recorder.set_tag(f"selftest.env.{name}", os.environ.get(name, "<unset>"))
    if p.action == "collective":
        _collective(spec, recorder)
        return
    # slowed or not is decided when the steps run: benchmarks/noise_gpu.py tells a loaded window
    # from a healthy one by its steps' times
    flag = p.slow_while.format(node=os.environ.get("SLURMD_NODENAME", ""))
    slow = 0.9 if p.slow_while and os.path.exists(flag) else 1.0
    for step in range(p.steps):
        recorder.log_step(step, value=float(step), loss=1.0 / (step + 1))
    if p.action == "stuck":  # blocked here: the signals wait for a thread that never takes them
        import signal

        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    if p.sleep_s:
        time.sleep(p.sleep_s)
    if p.action == "raise":
        raise RuntimeError(f"selftest: deliberate failure in {spec.experiment}/{spec.variant}")
    if p.action == "oom":
        raise MemoryError("selftest: deliberate out-of-memory")
    if p.action == "exhaust-memory":
        _exhaust_memory(p.exhaust_gib)
    if p.action == "skip":
        raise SkipRun("selftest: deliberately skipped")
    if p.action == "read-table":
        _read_table(spec, recorder)
    recorder.log_metric("value", float(p.steps) * _jitter(p, recorder) * slow)
    recorder.log_metric("steps", float(p.steps))


def _exhaust_memory(gib: float) -> None:
    """Warn (the last stderr line a killed job leaves), then write 64 MiB chunks until ``gib``."""
    import sys
    import warnings

    warnings.warn("selftest: about to fill host memory", stacklevel=1)
    sys.stderr.flush()
    chunk = 64 << 20
    held = [b"\x01" * chunk for _ in range(int(gib * (1 << 30)) // chunk)]
    del held


def _jitter(p: Any, recorder: Recording) -> float:
    """1, or a normal factor of standard deviation ``jitter``, the same for the same seed and
    repeat (deterministic, so that tests can assert what the statistics make of it)."""
    if not p.jitter:
        return 1.0
    import random

    return 1.0 + random.Random(p.seed * 100_003 + (recorder.repeat or 0)).gauss(0.0, p.jitter)


def _read_table(spec: RunView, recorder: Recording) -> None:
    """Read the ``table`` asset the run names: proves the workflow built it before the run."""
    import pyarrow.parquet as pq

    folder = spec.asset_path("table")
    table = pq.read_table(next(folder.glob("table.*")))
    recorder.set_tag("selftest.table", str(folder))
    recorder.log_metric("table_rows", float(table.num_rows))


def _collective(spec: RunView, recorder: Recording) -> None:
    """One all-reduce per step over the run's ranks (after ``sleep_s``); rank ``fail_rank``
    raises at ``fail_step``."""
    import torch
    import torch.distributed as dist

    p = spec.params
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    total = 0.0
    for step in range(p.steps):
        if rank == p.fail_rank and step == p.fail_step:
            raise RuntimeError(f"selftest: rank {rank} fails at step {step} on purpose")
        while rank == p.hang_rank and step == p.fail_step:
            time.sleep(60)  # hung: neither fails nor reaches the next collective
        time.sleep(p.sleep_s)  # a long run, for a node that dies while it runs
        t0 = time.perf_counter()
        x = torch.tensor([float(rank + 1)])
        if world > 1:
            dist.all_reduce(x)
        total = float(x.item())
        recorder.log_step(step, value=total, step_s=time.perf_counter() - t0)
    recorder.log_metric("value", total)
    recorder.log_metric("world_size_seen", float(world))
    recorder.log_metric("rank", float(rank))
