"""What each technique buys and what it costs: one sentence per variant a person can act on.

The report's older verdict ranked one metric (tokens/s), so every memory technique read as a
loss. Here a variant is weighed against the run it is compared with (``rows.reference_run``:
its baseline, its ``compare_to``, or on several GPUs its own same-GPU baseline) on four
figures: speed (the experiment's first directed headline metric), peak GPU memory (and what
the freed memory allows on this GPU), dollars and joules per unit of work (the recorded
figures: never re-priced here). Each ratio carries the noise test's interval where the runs
have repeats (``core.effects``), "1 sample each" where not. Pure functions over run rows, so
that the report and machines.html say the same words.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Sequence

from hopperlab.config.cost import COST_RATE
from hopperlab.core import effects
from hopperlab.core.rundir import read_samples
from hopperlab.results import correctness, marks
from hopperlab.results.machines.references import direction
from hopperlab.results.rows import RunRow, declared_reference, group_by_experiment, reference_run
from hopperlab.workloads import family_info

GIB = 2 ** 30
#: peak GPU memory metrics the families record, with their unit in bytes, first found wins
#: (finetune: allocated GiB; the sharded engine: GB used; inference: bytes allocated)
MEMORY_METRICS: tuple[tuple[str, float], ...] = (
    ("peak_gpu_allocated_gib", GIB), ("peak_gpu_mem_gb", 1e9),
    ("gpu_allocated_peak_bytes", 1.0), ("peak_device_used_gib", GIB))
#: a memory change smaller than this is no change worth a sentence (allocator rounding)
MEMORY_SAME_WITHIN = 0.05
#: a speed or price change smaller than this is "the same" when the runs have no noise test
SAME_WITHIN = effects.DEFAULT_MIN_EFFECT


@dataclass(frozen=True)
class Change:
    """One figure of a variant against its reference: ``ratio`` = new / old, its interval
    (None: a side has fewer than the samples a spread needs) and the noise test's verdict."""

    metric: str
    #: the variant's median and its reference's (bytes for a memory figure)
    new: float
    old: float
    #: the ratio's 95 % interval (low, high); None without repeats
    ci: tuple[float, float] | None = None
    #: effects.WORSE | BETTER | SAME | UNCLEAR, or "" where the noise test could not run
    verdict: str = ""

    @property
    def ratio(self) -> float:
        return self.new / self.old

    @property
    def low(self) -> float | None:
        return self.ci[0] if self.ci else None

    @property
    def high(self) -> float | None:
        return self.ci[1] if self.ci else None

    @property
    def percent(self) -> float:
        return (self.ratio - 1) * 100

    def interval(self, *, percent: bool = False) -> str:
        if self.low is None or self.high is None:
            return " (1 sample each)"
        if percent:
            return f" [{(self.low - 1) * 100:+.0f}, {(self.high - 1) * 100:+.0f} %]"
        return f" [{self.low:.2f}, {self.high:.2f}]"


@dataclass(frozen=True)
class Tradeoff:
    """A variant weighed against its reference; ``sentence`` is what the pages print."""

    family: str
    experiment: str
    variant: str
    against: str
    #: why the reference is not the declared one ("" when it is)
    against_note: str
    speed: Change | None
    #: the speed as "times as fast": new/old for a higher-is-better metric, old/new for a time
    speed_times: float | None
    memory: Change | None
    cost: Change | None
    cost_label: str
    energy: Change | None
    #: what the freed memory allows on this GPU ("" when nothing was freed or not known)
    fits: str
    advice: str

    def sentence(self) -> str:
        parts = []
        if self.speed is not None and self.speed_times is not None:
            lower = direction(self.family, self.speed.metric) == "lower"
            what = f"as fast on {self.speed.metric}" if lower else self.speed.metric
            parts.append(f"{self.speed_times:.2f}x {what}" + self.speed.interval())
        if self.memory is not None:
            parts.append(f"{self.memory.percent:+.0f} % GPU memory ({_gib(self.memory.new)} "
                         f"against {_gib(self.memory.old)})")
        if self.cost is not None:
            parts.append(f"{self.cost.percent:+.0f} % price {self.cost_label}"
                         + (self.cost.interval(percent=True) if self.cost.ci else ""))
        if self.energy is not None:
            parts.append(f"{self.energy.percent:+.1f} % joules per unit")
        against = f" against {self.against}" + (f" ({self.against_note})"
                                                if self.against_note else "")
        fits = f" ({self.fits})" if self.fits else ""
        figures = ", ".join(parts) + ": " if parts else ""
        return f"{self.variant}{against}: {figures}{self.advice}{fits}"


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.1f} GiB"


def _samples(row: RunRow) -> list[dict[str, float]]:
    folder = Path(row.run_dir)
    return read_samples(folder) if folder.is_dir() else []


def change(new_row: RunRow, old_row: RunRow, metric: str, way: str | None) -> Change | None:
    """``metric`` of ``new_row`` over ``old_row``'s with the noise test's interval where both
    have a spread; None: either lacks a positive figure."""
    old = effects.measure_from(old_row.metrics, _samples(old_row), metric)
    new = effects.measure_from(new_row.metrics, _samples(new_row), metric)
    if old is None or new is None or old.median <= 0 or new.median <= 0:
        return None
    try:
        e = effects.compare(new, old, direction=way)
    except ValueError:
        return Change(metric, new.median, old.median)
    return Change(metric, new.median, old.median, (e.ratio_low, e.ratio_high), e.verdict)


def speed_metric(runs: Sequence[RunRow]) -> str | None:
    """The experiment's first headline metric with a declared direction that an ok run has."""
    for r in runs:
        for m in r.headline_metrics:
            if direction(r.family, m) and any(m in x.metrics for x in runs if x.status == "ok"):
                return m
    return None


def memory_bytes(row: RunRow) -> tuple[str, float] | None:
    """The run's peak GPU memory metric and its value in bytes (None: not recorded)."""
    for name, unit in MEMORY_METRICS:
        if name in row.metrics:
            return name, row.metrics[name] * unit
    return None


def _memory(new_row: RunRow, old_row: RunRow) -> Change | None:
    new, old = memory_bytes(new_row), memory_bytes(old_row)
    if new is None or old is None or new[0] != old[0] or old[1] <= 0 or new[1] <= 0:
        return None
    return Change(new[0], new[1], old[1])


def _unit(row: RunRow) -> tuple[str, str, str, str] | None:
    """The first work unit both priced and named in the row: (cost metric, label, energy
    metric, the throughput metric it is priced from)."""
    try:
        units = family_info(row.family).work_units
    except (KeyError, ImportError, ValueError):
        return None
    for u in units:
        if u.name in row.metrics:
            return u.name, u.label, "energy" + u.name[len("cost"):] + "_j", \
                u.metric if u.kind == "per_s" else ""
    return None


def _priced_from_speed(cost: Change, speed: Change | None, unit: tuple[str, str, str, str],
                       row: RunRow, base: RunRow) -> Change:
    """The price ratio's interval where the runs have none of their own: a price per unit is
    the hourly rate over the throughput, so at one rate its ratio is the inverse of the
    throughput's, interval and all."""
    same_rate = row.metrics.get(COST_RATE) == base.metrics.get(COST_RATE)
    if cost.ci is not None or speed is None or speed.ci is None or not same_rate \
            or unit[3] != speed.metric:
        return cost
    return Change(cost.metric, cost.new, cost.old, (1 / speed.ci[1], 1 / speed.ci[0]),
                  cost.verdict)


def fits_words(memory: Change, capacity_gib: float | None) -> str:
    """What the memory freed allows: a batch ``old/new`` times larger fits in the memory the
    reference used (activations grow with the batch; the weights' share makes it an upper
    bound), and how much of this GPU the new peak fills."""
    if memory.ratio >= 1 - MEMORY_SAME_WITHIN:
        return ""
    words = f"a batch up to {1 / memory.ratio:.1f}x larger fits in the reference's memory"
    if capacity_gib:
        words += f"; its peak fills {memory.new / GIB / capacity_gib:.0%} of this GPU's " \
                 f"{capacity_gib:.0f} GiB"
    return words


def _faster(c: Change | None, times: float | None) -> str:
    """``better``, ``worse``, ``same`` (the noise test said so) or ``close`` (within
    ``SAME_WITHIN``, untested) for the speed: the noise test's word where it ran, else the
    size of the change."""
    if c is None or times is None:
        return "unknown"
    if c.verdict in (effects.BETTER, effects.WORSE):
        return c.verdict
    if c.verdict in (effects.SAME, effects.UNCLEAR):
        return "same"
    return "better" if times >= 1 + SAME_WITHIN else "worse" if times <= 1 - SAME_WITHIN \
        else "close"


def advice(speed: str, memory: Change | None, cost: Change | None) -> str:
    """The act-on-it clause from the speed's verdict and the memory's change."""
    freed = memory is not None and memory.ratio <= 1 - MEMORY_SAME_WITHIN
    grown = memory is not None and memory.ratio >= 1 + MEMORY_SAME_WITHIN
    dearer = cost is not None and cost.ratio >= 1 + SAME_WITHIN
    if speed == "better":
        return ("pays where memory is spare: faster, and needs more memory" if grown
                else "pays: faster" + (" and frees memory" if freed else ""))
    if speed in ("same", "close"):
        cost_words = ("at no speed cost beyond the noise" if speed == "same" else
                      f"at a speed within {SAME_WITHIN:.0%} (untested: repeat to tell)")
        return (f"pays: frees memory {cost_words}" if freed
                else f"costs memory and buys no speed ({cost_words[3:]}): does not pay" if grown
                else f"no difference worth having ({cost_words[3:]})")
    if speed == "worse":
        if freed:
            return "pays where memory is the limit" + (", at a higher price per unit"
                                                       if dearer else "")
        return "does not pay here: slower and frees no memory"
    return "speed not compared" + ("; frees memory" if freed else "")


def tradeoff(row: RunRow, runs: Sequence[RunRow], metric: str | None) -> Tradeoff | None:
    """``row`` weighed against its reference in ``runs`` (its experiment's rows); None: the row
    is its own reference, has none, or either is not ok, or the row computed something else
    than its reference (``correctness``: a fast wrong run is never a finding)."""
    base = reference_run(row, runs)
    if base is None or base is row or row.status != "ok" or base.status not in ("ok", "oom"):
        return None
    if not correctness.offered(row):
        return None
    declared = declared_reference(row, runs)
    note = "" if base.variant == declared else \
        f"the same {base.gpus} GPU(s); {declared} has no run here"
    if base.status == "oom":  # the point of a memory technique: it runs where this did not
        return Tradeoff(row.family, row.experiment, row.variant, base.variant, note, None, None,
                        None, None, "", None, "",
                        f"pays where memory is the limit: {base.variant} ran out of memory "
                        "here, this fits")
    speed = times = None
    if metric is not None:
        way = direction(row.family, metric)
        speed = change(row, base, metric, way)
        if speed is not None:
            times = 1 / speed.ratio if way == "lower" else speed.ratio
    memory = _memory(row, base)
    unit = _unit(row)
    cost = energy = None
    label = ""
    if unit is not None:
        cost = change(row, base, unit[0], "lower")
        if cost is not None and row.tags.get("cost.currency") != base.tags.get("cost.currency"):
            cost = None  # no exchange rates
        label = unit[1]
        if cost is not None:
            cost = _priced_from_speed(cost, speed, unit, row, base)
        energy = change(row, base, unit[2], "lower")
    capacity = row.hardware.get("gpu_memory_gb")
    fits = fits_words(memory, capacity if isinstance(capacity, (int, float)) else None) \
        if memory is not None else ""
    return Tradeoff(row.family, row.experiment, row.variant, base.variant, note, speed, times, memory, cost,
                    label, energy, fits, advice(_faster(speed, times), memory, cost))


def experiment_tradeoffs(runs: Sequence[RunRow]) -> list[Tradeoff]:
    """Every ok variant of one experiment weighed against its reference (CPU stand-ins are no
    finding: left out)."""
    if any(marks.stand_in(r) for r in runs):
        return []
    metric = speed_metric(runs)
    return [t for r in runs if (t := tradeoff(r, runs, metric)) is not None]


def tradeoffs(runs: Sequence[RunRow]) -> dict[tuple[str, str], list[Tradeoff]]:
    """(family, experiment) -> its variants' trade-offs, experiments without any left out."""
    out = {}
    for key, group in group_by_experiment(runs).items():
        found = experiment_tradeoffs(group)
        if found:
            out[key] = found
    return out


def pareto_front(runs: Sequence[RunRow], metric: str | None) -> list[str]:
    """The ok variants no other beats on both speed and peak GPU memory (the speed-against-
    memory view's front), fastest first; [] without both figures on two runs or more. A run
    that reads DIFFERENT is no point of it (``correctness.findings``): a fast wrong run would
    push the honest ones off the front."""
    way = direction(runs[0].family, metric) if runs and metric else None
    points = []
    for r in correctness.findings(runs):
        mem = memory_bytes(r) if r.status == "ok" else None
        if mem is None or metric not in r.metrics or marks.stand_in(r):
            continue
        speed = r.metrics[metric] if way == "higher" else -r.metrics[metric]
        points.append((r.variant, speed, mem[1]))
    if len(points) < 2:
        return []

    def beaten(p: tuple[str, float, float]) -> bool:
        return any(q[1] >= p[1] and q[2] <= p[2] and (q[1] > p[1] or q[2] < p[2])
                   for q in points)

    return [p[0] for p in sorted(points, key=lambda p: -p[1]) if not beaten(p)]


#: the heading both pages lead with (a test reads the sentences under it)
HEADING = "What each technique buys and what it costs"


def tradeoffs_html(runs: Sequence[RunRow], where: str = "") -> str:
    """The pages' lead section: per experiment, one sentence per variant ('' when no
    experiment has a variant with a reference). ``where`` names the machine (machines.html)."""
    found = tradeoffs(runs)
    if not found:
        return ""
    items = []
    groups = group_by_experiment(runs)
    for (family, experiment), ts in found.items():
        lines = "".join(f'<li class="tradeoff">{escape(t.sentence())}</li>' for t in ts)
        group = groups[(family, experiment)]
        front = pareto_front(group, speed_metric(group))
        wrong = correctness.left_out(group)
        if front:
            lines += (f'<li class="pareto">speed against peak GPU memory, beaten on both by no '
                      f"other (the Pareto front): {escape(', '.join(front))}</li>")
        if wrong:  # named, never weighed nor on the front
            lines += (f'<li class="different">not weighed nor on the front, '
                      f"{escape(wrong)}</li>")
        items.append(f"<li><b>{escape(family)} / {escape(experiment)}</b><ul>{lines}</ul></li>")
    on = f" on {escape(where)}" if where else ""
    return (f'<section class="tradeoffs"><h3>{HEADING}{on}</h3>'
            '<p class="meta">each variant against the run it is compared with: speed on the '
            "experiment's first headline metric (95 % interval where there are repeats), peak "
            "GPU memory and what the memory freed allows on this GPU, the price and energy per "
            "unit of work as each run recorded them</p>"
            f'<ul class="verdicts">{"".join(items)}</ul></section>')


#: the style of the lead and of the folded details below it (both pages append it)
CSS = ("details.fold>summary{cursor:pointer;margin:.6em 0}details.fold>summary>h2,"
       "details.fold>summary>h3{display:inline}li.tradeoff{margin:.25em 0}"
       "section.tradeoffs h3{margin-bottom:.2em}")
