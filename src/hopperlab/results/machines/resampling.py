"""Does the check cry wolf, and does it catch a 10 % slowdown? A resampling study on real samples
(issue 36; docs/benchmarks/noise.md has the figures).

For each draw and each run, the run's samples are shuffled: the first ``n_ref`` become its
reference, written as ``hopperlab references update`` writes one (median, robust spread, count,
minimum effect ``core.effects.min_effect_for``), and the next sample is the check's. A healthy
check judges that sample as it is; a slowed check judges it ``shift`` worse on every judged
metric (times x1.1, rates /1.1). Both go through the check's own code
(``references.judge_metric``); a check fails on a ``regression`` (``inconclusive`` does not
fail a non-strict check). Per run and for the whole subset (one check = every run's sample of
that draw): the share of healthy checks that fail (false alarms) and of slowed checks that fail
(detections). A run whose judged metric needs a bigger change than ``shift`` to count (its
minimum effect in most draws above it) is ``insensitive``: reported, and left out of the
detection count, since no check can detect there what its noise hides.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from hopperlab.core.effects import min_effect_for
from hopperlab.core.stats import percentile, robust_spread
from hopperlab.results.machines import references as refs_mod

Samples = Sequence[Mapping[str, float]]


@dataclass
class RunRates:
    key: str
    metrics: list[str]
    false_alarms: int = 0
    detections: int = 0
    #: draws whose minimum effect (any judged metric) was above the shift
    insensitive_draws: int = 0
    min_effects: list[float] = field(default_factory=list)

    def sensitive(self, draws: int) -> bool:
        return self.insensitive_draws <= draws // 2


@dataclass
class Study:
    draws: int
    n_ref: int
    shift: float
    runs: dict[str, RunRates]
    #: whole-subset checks: any run's regression fails the check
    false_alarms: int = 0
    detections: int = 0

    def rate(self, count: int) -> float:
        return count / self.draws

    def lines(self) -> list[str]:
        out = [f"{'run':42s} {'min effect (median)':>19s} {'false alarms':>13s} "
               f"{'detected':>9s}"]
        for key, r in sorted(self.runs.items()):
            eff = percentile(r.min_effects, 50) if r.min_effects else float("nan")
            det = (f"{self.rate(r.detections):9.1%}" if r.sensitive(self.draws)
                   else "insensitive")
            out.append(f"{key:42s} {eff:19.1%} {self.rate(r.false_alarms):13.1%} {det:>9s}")
        out.append(f"{'whole subset':42s} {'':19s} {self.rate(self.false_alarms):13.1%} "
                   f"{self.rate(self.detections):9.1%}")
        return out


def _reference(values: Sequence[float]) -> refs_mod.Reference:
    return refs_mod.Reference(value=percentile(values, 50), spread=robust_spread(values),
                              n=len(values), min_effect=min_effect_for(values))


def _slowed(value: float, way: str | None, shift: float) -> float:
    return value / (1 + shift) if way == "higher" else value * (1 + shift)


def study(samples: Mapping[str, Samples], draws: int = 1000, n_ref: int = 15,
          shift: float = 0.10, seed: int = 0) -> Study:
    """The study over ``samples`` (run key -> its samples' metrics)."""
    rng = random.Random(seed)
    runs: dict[str, RunRates] = {}
    for key, rows in samples.items():
        family = key.split("/")[0]
        metrics = sorted({m for s in rows for m in s if refs_mod.judged(family, m)
                          and refs_mod.direction(family, m) is not None})
        if len(rows) < n_ref + 1 or not metrics:
            raise ValueError(f"{key}: {len(rows)} samples and judged metrics {metrics}: the "
                             f"study needs {n_ref + 1} samples and one judged metric")
        runs[key] = RunRates(key, metrics)
    result = Study(draws, n_ref, shift, runs)
    for _ in range(draws):
        healthy_fail = slowed_fail = False
        for key, rows in samples.items():
            family, rates = key.split("/")[0], runs[key]
            order = list(rows)
            rng.shuffle(order)
            ref_rows, check = order[:n_ref], order[n_ref]
            fails = {False: False, True: False}
            insensitive = False
            for metric in rates.metrics:
                ref = _reference([float(r[metric]) for r in ref_rows if metric in r])
                rates.min_effects.append(ref.effect_floor)
                insensitive |= ref.effect_floor > shift
                way = refs_mod.direction(family, metric)
                for slowed in (False, True):
                    value = float(check[metric])
                    value = _slowed(value, way, shift) if slowed else value
                    f = refs_mod.judge_metric(family, key, metric, [value], ref, "study")
                    fails[slowed] |= f.verdict == refs_mod.REGRESSION
            rates.insensitive_draws += insensitive
            rates.false_alarms += fails[False]
            rates.detections += fails[True]
            healthy_fail |= fails[False]
            slowed_fail |= fails[True]
        result.false_alarms += healthy_fail
        result.detections += slowed_fail
    return result
