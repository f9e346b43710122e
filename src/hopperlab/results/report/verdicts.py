"""The report's first section: per family, one short verdict per experiment (which variant is
faster than the one it is compared with, by how much, with the interval of the noise test),
before the details. Runs measured once say so instead of an interval."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from hopperlab.core import effects
from hopperlab.core.rundir import read_samples
from hopperlab.results.machines.references import direction
from hopperlab.results.machines.tradeoffs import speed_metric
from hopperlab.results import correctness, marks
from hopperlab.results.rows import RunRow, group_by_experiment, reference_run


@dataclass(frozen=True)
class VariantEffect:
    variant: str
    #: the variant it is compared with: its ``compare_to``, else the baseline
    against: str
    metric: str
    #: how many times better than the baseline (a time inverted: 2.0 = twice as fast)
    times: float
    low: float | None
    high: float | None
    verdict: str            # effects.WORSE | BETTER | SAME | UNCLEAR, or "" (noise unknown)


def _samples(row: RunRow) -> list[dict[str, float]]:
    folder = Path(row.run_dir)
    return read_samples(folder) if folder.is_dir() else []


def variant_effects(runs: Sequence[RunRow]) -> tuple[str | None, list[VariantEffect]]:
    """Each ok variant against the variant it is compared with (its ``compare_to``, else the
    baseline, as the report's ratios) on the experiment's first directed metric."""
    metric = speed_metric(runs)
    if metric is None:
        return metric, []
    out = []
    for r in runs:
        base = reference_run(r, runs)
        if base is None or r is base or r.status != "ok" or base.status != "ok" \
                or not correctness.offered(r):  # DIFFERENT: another computation, no finding
            continue
        way = direction(base.family, metric)
        old = effects.measure_from(base.metrics, _samples(base), metric)
        new = effects.measure_from(r.metrics, _samples(r), metric)
        if old is None:
            continue
        if new is None or new.median <= 0 or old.median <= 0:
            continue
        flip = way == "lower"
        try:
            e = effects.compare(new, old, direction=way)
            lo, hi = (1 / e.ratio_high, 1 / e.ratio_low) if flip else (e.ratio_low, e.ratio_high)
            out.append(VariantEffect(r.variant, base.variant, metric,
                                     1 / e.ratio if flip else e.ratio, lo, hi, e.verdict))
        except ValueError:
            ratio = new.median / old.median
            out.append(VariantEffect(r.variant, base.variant, metric,
                                     1 / ratio if flip else ratio, None, None, ""))
    return metric, out


def _say(v: VariantEffect) -> str:
    word = "faster" if any(k in v.metric for k in ("time", "_ms", "_s", "per_s", "gbps", "qps",
                                                   "lat")) else "better"
    times = v.times if v.times >= 1 else 1 / v.times
    way = word if v.times >= 1 else {"faster": "slower", "better": "worse"}[word]
    if v.low is not None and v.high is not None:
        lo, hi = (v.low, v.high) if v.times >= 1 else (1 / v.high, 1 / v.low)
        ci = f" [{lo:.2f}, {hi:.2f}]"
    else:
        ci = " (1 sample each)"
    return f"{v.variant} {times:.2f}x {way} than {v.against}{ci}"


def experiment_line(runs: Sequence[RunRow]) -> str | None:
    """``experiment: best ..., worst ..., n within noise`` (None: nothing to compare)."""
    stand = [r for r in runs if marks.stand_in(r)]
    if stand:  # a CPU running a GPU study's code: its ratios are no finding, never ranked
        return (f"{runs[0].experiment}: {len(stand)} run(s) are {marks.STAND_IN}s (no GPU was "
                "measured): not ranked, a check that the code path runs")
    metric, found = variant_effects(runs)
    wrong = [r.variant for r in runs if not correctness.offered(r)]
    if not found:
        return (f"{runs[0].experiment}: {', '.join(wrong)} DIFFERENT from what they are "
                "compared with: not ranked") if wrong else None
    tested = [v for v in found if v.verdict]
    same = [v for v in tested if v.verdict in (effects.SAME, effects.UNCLEAR)]
    ranked = sorted((v for v in found if v not in same), key=lambda v: v.times, reverse=True)
    parts = []
    if ranked and ranked[0].times > 1:
        parts.append("best " + _say(ranked[0]))
    if ranked and ranked[-1].times < 1:
        parts.append("worst " + _say(ranked[-1]))
    if same:
        parts.append(f"{len(same)} within noise of what they are compared with")
    if not parts:
        parts.append("no variant differs from what it is compared with")
    if wrong:
        parts.append(f"{', '.join(wrong)} DIFFERENT (another result): not ranked")
    return f"{runs[0].experiment}, on {metric}: " + "; ".join(parts)


def family_verdicts(runs: Sequence[RunRow]) -> dict[str, list[str]]:
    """family -> one verdict line per experiment that has a baseline to compare with."""
    out: dict[str, list[str]] = {}
    for (family, _), group in group_by_experiment(runs).items():
        line = experiment_line(group)
        if line:
            out.setdefault(family, []).append(line)
    return out

