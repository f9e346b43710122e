"""A run measured ``repeats`` times: each repeat's metrics kept as a sample, the median reported
with its 95 % interval, CV and count (``hopperlab.core.stats.aggregate_samples``).

Why here and not in each family: every family, selftest included, honours ``repeats`` the same
way by default (``reruns``: the entry is called again in the job's process, each call with its
own set-up and warm-up, so a sample is what one run measures). A family whose set-up dwarfs its
measurement (a model trained before its latency is measured) declares ``repeat_unit =
"windows"`` and measures ``spec.repeats`` windows after one warm-up itself; a family of several
engines declares it per engine (``EngineInfo.repeat_unit``).
"""

from __future__ import annotations

import gc
import math
import sys
from collections.abc import Callable
from typing import Any

from hopperlab.core.energy_names import TAG_WORK_NOT_COUNTED
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


def repeat_unit(spec: Any, info: FamilyInfo) -> str:
    """What one repeat of this run is: its engine's declaration (``EngineInfo.repeat_unit``;
    a family without engines declares it on itself)."""
    unit = info.engine_of(getattr(spec, "params", None)).repeat_unit
    if unit not in REPEAT_UNITS:
        raise ValueError(f"{info.name}: repeat_unit {unit!r} is not one of "
                         f"{', '.join(REPEAT_UNITS)}")
    return unit


def measure(workload: Callable[[Any, Recorder], None], spec: Any, rec: Recorder,
            info: FamilyInfo) -> None:
    """Call the family's entry as ``spec.repeats`` asks; leave the final metrics in ``rec``."""
    repeats = int(getattr(spec, "repeats", 1) or 1)
    unit = repeat_unit(spec, info)
    if repeats == 1:
        workload(spec, rec)
        return
    rec.set_tag("repeats", repeats)
    rec.set_tag("repeat_unit", unit)
    if unit == "windows":
        workload(spec, rec)
        if len(rec.samples) != repeats:
            raise RuntimeError(f"{info.name} measures repeats as windows but recorded "
                               f"{len(rec.samples)} samples for repeats={repeats}")
    else:
        for i in range(repeats):
            rec.repeat = i
            rec.metrics.clear()
            workload(spec, rec)
            rec.add_sample(rec.metrics)
            _release_memory()
        rec.repeat = None
    rec.metrics.update(aggregate_samples(rec.samples, stat_metrics(spec, info)))
    _settle_work_done(rec, info)


def _settle_work_done(rec: Recorder, info: FamilyInfo) -> None:
    """The run's work done from its samples: every window's summed where each sample counted
    it; dropped, with the reason in tag ``energy.work_not_counted``, where only some did (the
    median ``aggregate_samples`` left would be a part of the work of every window's joules)."""
    rec.metrics.update(work_done_totals(rec.samples, info))
    uncounted = work_done_uncounted(rec.samples, info)
    for name in uncounted:
        rec.metrics.pop(name, None)
    if uncounted and TAG_WORK_NOT_COUNTED not in rec.tags:
        rec.set_tag(TAG_WORK_NOT_COUNTED, f"{', '.join(uncounted)} not counted in every one of "
                    f"the {len(rec.samples)} samples: the windows' total is unknown")


def _work_done_names(info: FamilyInfo) -> list[str]:
    """Every metric a unit of the family multiplies into its work done (``WorkUnit.done``)."""
    return sorted({n for u in info.work_units for n in u.done})


def _counted(sample: dict[str, float], name: str) -> bool:
    """Whether ``sample`` counted ``name``: present and finite (a NaN is a count that failed)."""
    return name in sample and math.isfinite(float(sample[name]))


def work_done_totals(samples: list[dict[str, float]], info: FamilyInfo) -> dict[str, float]:
    """The work done inside the measured windows (``WorkUnit.done``) summed over the samples,
    where every sample counted it: the meter adds every window's joules, so J per unit divides
    by every window's work, not by one sample's (the median ``aggregate_samples`` gives)."""
    out: dict[str, float] = {}
    for name in _work_done_names(info):
        if samples and all(_counted(s, name) for s in samples):
            out[name] = sum(float(s[name]) for s in samples)
    return out


def work_done_uncounted(samples: list[dict[str, float]], info: FamilyInfo) -> list[str]:
    """The work-done metrics some samples counted and others did not (absent or not finite):
    the windows' total is unknown, and the median of the samples that have it would divide
    every window's joules by a part of their work. Such a metric is dropped from the run's
    figures, so its J per unit goes by the rate and says so (``energy.basis``)."""
    return [name for name in _work_done_names(info)
            if any(name in s for s in samples) and not all(_counted(s, name) for s in samples)]
