"""A run measured ``repeats`` times: each repeat's metrics kept as a sample, the median reported
with its 95 % interval, CV and count (``hopperlab.core.stats.aggregate_samples``).

Why here and not in each family: every family, selftest included, honours ``repeats`` the same
way by default (``reruns``: the entry is called again in the job's process, each call with its
own set-up and warm-up, so a sample is what one run measures). A family whose set-up dwarfs its
measurement (a model trained before its latency is measured) declares ``repeat_unit =
"windows"`` and measures ``spec.repeats`` windows after one warm-up itself.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any

from hopperlab.core.rundir import Recorder
from hopperlab.core.stats import aggregate_samples
from hopperlab.workloads.base import FamilyInfo

REPEAT_UNITS = ("reruns", "windows")


def stat_metrics(spec: Any, info: FamilyInfo) -> tuple[str, ...]:
    """The metrics that get an interval, CV and count: the headline ones and every metric the
    family declares a direction for (the ones references and comparisons judge)."""
    names = list(getattr(spec, "headline_metrics", ()) or info.headline_metrics)
    names += [m for m in info.directions if m not in names]
    return tuple(names)


def _release_memory() -> None:
    """What one rerun held goes before the next (a 7B model twice would not fit)."""
    gc.collect()
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available() and cuda.is_initialized():
        cuda.synchronize()
        cuda.empty_cache()


def measure(workload: Callable[[Any, Recorder], None], spec: Any, rec: Recorder,
            info: FamilyInfo) -> None:
    """Call the family's entry as ``spec.repeats`` asks; leave the final metrics in ``rec``."""
    repeats = int(getattr(spec, "repeats", 1) or 1)
    if info.repeat_unit not in REPEAT_UNITS:
        raise ValueError(f"{info.name}: repeat_unit {info.repeat_unit!r} is not one of "
                         f"{', '.join(REPEAT_UNITS)}")
    if repeats == 1:
        workload(spec, rec)
        return
    rec.set_tag("repeats", repeats)
    rec.set_tag("repeat_unit", info.repeat_unit)
    first = 0
    if info.repeat_unit == "windows":
        workload(spec, rec)
        if rec.samples and len(rec.samples) != repeats:
            raise RuntimeError(f"{info.name} measures repeats as windows but recorded "
                               f"{len(rec.samples)} samples for repeats={repeats}")
        if not rec.samples:  # a path of the family without windows (e.g. another backend)
            rec.set_tag("repeat_unit", "reruns")
            rec.add_sample(rec.metrics)
            _release_memory()
            first = 1
    if not rec.samples or first:
        for i in range(first, repeats):
            rec.repeat = i
            rec.metrics.clear()
            workload(spec, rec)
            rec.add_sample(rec.metrics)
            _release_memory()
        rec.repeat = None
    rec.metrics.update(aggregate_samples(rec.samples, stat_metrics(spec, info)))
    rec.metrics.update(work_done_totals(rec.samples, info))


def work_done_totals(samples: list[dict[str, float]], info: FamilyInfo) -> dict[str, float]:
    """The work done inside the measured windows (``WorkUnit.done``) summed over the samples
    that carry it: the meter adds every window's joules, so J per unit divides by every
    window's work, not by one sample's (the median ``aggregate_samples`` gives)."""
    names = {n for u in info.work_units for n in u.done}
    out: dict[str, float] = {}
    for name in names:
        values = [float(s[name]) for s in samples if name in s]
        if values and len(values) == len(samples):
            out[name] = sum(values)
    return out
